"""CUDA's ``torch.amp.autocast("cuda", dtype=...)`` emulated on the CPU, for LeRobot code whose fp32 regions
are CUDA autocast contexts (imported as a sibling module by the LeRobot side of an interop driver).

Why: LeRobot 0.6.1's FastWAM computes its time embedding, time projection and video head under
``with torch.amp.autocast("cuda", dtype=torch.float32)``. On a CPU that context is inert (CUDA autocast
only ever touches CUDA tensors; torch warns and disables it), so a bf16 model meets fp32 inputs in those
regions and fails, and CPU autocast refuses ``dtype=float32``. This module gives the CPU what CUDA does.

What CUDA autocast does (ATen's ``autocast_mode.cpp`` / ``autocast_mode.h``: ``AT_FORALL_LOWER_PRECISION_FP``,
``AT_FORALL_FP32``, ``AT_FORALL_FP32_SET_OPT_DTYPE``, ``AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE``,
``AT_FORALL_PROMOTE``), for the ops of its lists only, above autograd (the casts are recorded, so gradients
flow back through them into the original dtype), with every other op left to ordinary type promotion:

* lower_precision_fp (linear, matmul, mm, mv, bmm, addmm, addmv, addr, baddbmm, addbmm, einsum,
  chain_matmul, linalg_multi_dot, linalg_vecdot, prelu, conv*, conv_transpose*, conv_tbc, convolution, the
  RNN cells, scaled_dot_product_attention): every eligible tensor argument cast to the autocast dtype;
* fp32 (pow, exp, log*, rsqrt, reciprocal, layer_norm, group_norm, softplus, the losses, cdist, ...): cast
  to float32 whatever the autocast dtype;
* fp32_set_opt_dtype (sum, prod, cumsum, cumprod, softmax, log_softmax, linalg_vector_norm,
  linalg_matrix_norm): ``dtype=float32`` when the caller gave none and the first argument is eligible;
* fp32_append_dtype (norm): not emulated (an op of it stops the run, see below);
* promote (addcdiv, addcmul, atan2, bilinear, cross, dot, vdot, grid_sampler, index_put, tensordot,
  scatter_add): eligible arguments cast to the widest among them, starting from the autocast dtype (so
  float32 when that is float32).

"Eligible" is ATen's ``is_eligible``: a floating-point tensor other than float64 (on CUDA there; on the CPU
here). The emulation is a ``TorchFunctionMode`` that applies these casts to the public functions that
reach those ATen ops (``F.linear``, ``torch.matmul`` and ``Tensor.__matmul__``, ``F.layer_norm``, ...),
pushed while an emulated region is entered. At each call it reads torch's own CUDA autocast state
(``torch.is_autocast_enabled("cuda")``, ``torch.get_autocast_dtype("cuda")``), which the emulated context
sets and restores, and which torch's real ``autocast("cuda", enabled=False)`` also sets: LeRobot's
``@torch.amp.autocast("cuda", enabled=False)`` decorators (applied when its modules are imported, so left
as they are) therefore still mean "nothing is cast in here", even nested in an emulated region, as on CUDA.
Setting that state on the CPU changes no CPU op: the AutocastCUDA dispatch key exists on CUDA tensors only.

Completeness: a function called in an enabled region that is neither on the cast lists above nor on
``NOT_AUTOCAST`` (functions checked to reach no listed ATen op: views, elementwise arithmetic, casts,
``F.silu``, ...) raises ``UnclassifiedOp``: a LeRobot change cannot silently run an op the emulation does
not know. ``seen()`` lists what ran, for the driver's report.

What it cannot prove: CUDA's kernels are not the CPU's (other summation orders in matmul and reductions),
so this reproduces which dtype every op computes in, not CUDA's last bits. ``CudaAutocast.override``
(list entry -> dtype, e.g. ``{"linear": torch.bfloat16}``) casts those ops to another dtype instead, to
show that a comparison notices a region computing in bf16.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, Self

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode, resolve_name

LOWER, FP32, FP32_SET_OPT_DTYPE, PROMOTE = "lower_precision_fp", "fp32", "fp32_set_opt_dtype", "promote"
T = torch.Tensor


def _named(policy: str, entry: str, *functions: Callable) -> dict[str, tuple[str, str]]:
    return {resolve_name(f) or repr(f): (policy, entry) for f in functions}


# Public callables -> (policy, the ATen list entry they reach). Python-level wrappers (F.layer_norm,
# torch.einsum, Tensor.__rpow__, ...) are what the mode sees: the ops they call inside are not seen again.
POLICIES: dict[str, tuple[str, str]] = {
    **_named(LOWER, "linear", F.linear),
    **_named(LOWER, "matmul", torch.matmul, T.matmul, T.__matmul__, T.__rmatmul__),
    **_named(LOWER, "mm", torch.mm, T.mm),
    **_named(LOWER, "mv", torch.mv, T.mv),
    **_named(LOWER, "bmm", torch.bmm, T.bmm),
    **_named(LOWER, "addmm", torch.addmm, T.addmm),
    **_named(LOWER, "addmv", torch.addmv, T.addmv),
    **_named(LOWER, "addr", torch.addr, T.addr),
    **_named(LOWER, "baddbmm", torch.baddbmm, T.baddbmm),
    **_named(LOWER, "addbmm", torch.addbmm, T.addbmm),
    **_named(LOWER, "einsum", torch.einsum),
    **_named(LOWER, "chain_matmul", torch.chain_matmul),
    **_named(LOWER, "linalg_multi_dot", torch.linalg.multi_dot),
    **_named(LOWER, "linalg_vecdot", torch.linalg.vecdot),
    **_named(LOWER, "prelu", torch.prelu, F.prelu),
    **_named(LOWER, "conv", torch.conv1d, torch.conv2d, torch.conv3d, torch.conv_tbc, torch.convolution),
    **_named(LOWER, "conv_transpose", torch.conv_transpose1d, torch.conv_transpose2d, torch.conv_transpose3d),
    **_named(LOWER, "rnn_cell", torch.lstm_cell, torch.gru_cell, torch.rnn_tanh_cell, torch.rnn_relu_cell),
    **_named(LOWER, "scaled_dot_product_attention", F.scaled_dot_product_attention),
    **_named(FP32, "acos", torch.acos, T.acos),
    **_named(FP32, "asin", torch.asin, T.asin),
    **_named(FP32, "cosh", torch.cosh, T.cosh),
    **_named(FP32, "erfinv", torch.erfinv, T.erfinv),
    **_named(FP32, "exp", torch.exp, T.exp),
    **_named(FP32, "expm1", torch.expm1, T.expm1),
    **_named(FP32, "log", torch.log, T.log),
    **_named(FP32, "log10", torch.log10, T.log10),
    **_named(FP32, "log2", torch.log2, T.log2),
    **_named(FP32, "log1p", torch.log1p, T.log1p),
    **_named(FP32, "reciprocal", torch.reciprocal, T.reciprocal, T.__rtruediv__),  # 1 / x: reciprocal
    **_named(FP32, "rsqrt", torch.rsqrt, T.rsqrt),
    **_named(FP32, "sinh", torch.sinh, T.sinh),
    **_named(FP32, "tan", torch.tan, T.tan),
    **_named(FP32, "pow", torch.pow, T.pow, T.__pow__, T.__rpow__),
    **_named(FP32, "softplus", F.softplus),
    **_named(FP32, "layer_norm", F.layer_norm, torch.layer_norm, torch.native_layer_norm),
    **_named(FP32, "group_norm", F.group_norm, torch.group_norm),
    **_named(FP32, "cosine_similarity", F.cosine_similarity),
    **_named(FP32, "loss", F.mse_loss, F.l1_loss, F.smooth_l1_loss, F.huber_loss, F.kl_div, F.nll_loss),
    **_named(FP32, "binary_cross_entropy_with_logits", F.binary_cross_entropy_with_logits),
    **_named(FP32, "dist", torch.dist, T.dist, torch.cdist, F.pdist),
    **_named(FP32, "renorm", torch.renorm, T.renorm),
    **_named(FP32, "logsumexp", torch.logsumexp, T.logsumexp),
    **_named(FP32_SET_OPT_DTYPE, "sum", torch.sum, T.sum),
    **_named(FP32_SET_OPT_DTYPE, "prod", torch.prod, T.prod),
    **_named(FP32_SET_OPT_DTYPE, "cumsum", torch.cumsum, T.cumsum),
    **_named(FP32_SET_OPT_DTYPE, "cumprod", torch.cumprod, T.cumprod),
    **_named(FP32_SET_OPT_DTYPE, "softmax", torch.softmax, T.softmax, F.softmax),
    **_named(FP32_SET_OPT_DTYPE, "log_softmax", torch.log_softmax, T.log_softmax, F.log_softmax),
    **_named(FP32_SET_OPT_DTYPE, "linalg_vector_norm", torch.linalg.vector_norm),
    **_named(FP32_SET_OPT_DTYPE, "linalg_matrix_norm", torch.linalg.matrix_norm),
    **_named(PROMOTE, "addcdiv", torch.addcdiv, T.addcdiv),
    **_named(PROMOTE, "addcmul", torch.addcmul, T.addcmul),
    **_named(PROMOTE, "atan2", torch.atan2, T.atan2),
    **_named(PROMOTE, "bilinear", F.bilinear),
    **_named(PROMOTE, "cross", torch.cross, T.cross),
    **_named(PROMOTE, "dot", torch.dot, T.dot, torch.vdot, T.vdot),
    **_named(PROMOTE, "index_put", torch.index_put, T.index_put),
    **_named(PROMOTE, "tensordot", torch.tensordot),
    **_named(PROMOTE, "scatter_add", torch.scatter_add, T.scatter_add),
}

# Functions that reach none of the ATen ops above (so CUDA autocast leaves them to type promotion): shape
# and view ops, casts, elementwise arithmetic and activations outside the fp32 list, constructors,
# attribute reads. Only these and POLICIES may run in an enabled region.
NOT_AUTOCAST: frozenset[str] = frozenset(
    resolve_name(f) or repr(f)
    for f in (
        T.reshape, T.view, T.unsqueeze, T.squeeze, T.chunk, T.unflatten, T.flatten, T.contiguous,
        T.__getitem__, T.transpose, T.permute, T.expand, T.split, torch.cat, torch.stack,
        T.float, T.type, T.type_as, T.to, T.double, T.detach, T.dim, T.size, T.numel,
        T.__add__, T.__radd__, T.__iadd__, T.add, torch.add, T.__sub__, T.__rsub__, T.sub,
        T.__mul__, T.__rmul__, T.mul, torch.mul, T.__truediv__, T.div, torch.div, T.__neg__,
        torch.outer, torch.cos, torch.sin, T.cos, T.sin, torch.arange, torch.ones, torch.zeros,
        F.silu, F.gelu, torch.sigmoid, T.sigmoid,
        T.dtype.__get__, T.shape.__get__, T.device.__get__, T.ndim.__get__, T.requires_grad.__get__,
        T.is_floating_point, T.__len__,
    )
)  # fmt: skip


class UnclassifiedOp(RuntimeError):
    """An op ran in an emulated CUDA autocast region that this module has not classified."""


_seen: dict[str, set[str]] = {}


def seen() -> dict[str, str]:
    """Every function called in an enabled emulated region since the last :func:`forget` -> its policy and
    the casts it made (``bfloat16->float32``), or ``nothing cast``."""
    return {name: "; ".join(sorted(notes)) for name, notes in sorted(_seen.items())}


def forget() -> None:
    _seen.clear()


def _note(name: str, policy: str, before: list[torch.dtype], after: list[torch.dtype]) -> None:
    casts = sorted({f"{str(a)[6:]}->{str(b)[6:]}" for a, b in zip(before, after, strict=True) if a != b})
    _seen.setdefault(name, set()).add(f"{policy}: {', '.join(casts) or 'nothing cast'}")


def _eligible(value: Any) -> bool:
    """ATen's ``is_eligible``, the CPU standing in for CUDA: floating point, not float64."""
    return isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != torch.float64


def _cast(value: Any, dtype: torch.dtype) -> Any:
    if _eligible(value) and value.dtype != dtype:
        return value.to(dtype)
    if isinstance(value, list | tuple):  # TensorList arguments (cat, einsum's operands, multi_dot)
        return type(value)(_cast(item, dtype) for item in value)
    return value


def _tensors(args: tuple, kwargs: dict) -> Iterator[torch.Tensor]:
    for value in (*args, *kwargs.values()):
        for item in value if isinstance(value, list | tuple) else (value,):
            if _eligible(item):
                yield item


class _Mode(TorchFunctionMode):
    def __init__(self, override: dict[str, torch.dtype]) -> None:
        super().__init__()
        self.override = override

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not torch.is_autocast_enabled("cuda"):
            return func(*args, **kwargs)
        name = resolve_name(func) or repr(func)
        policy, entry = POLICIES.get(name, (None, None))
        if policy is None:
            if name not in NOT_AUTOCAST:
                raise UnclassifiedOp(f"{name} ran in an emulated CUDA autocast region and is not classified")
            _seen.setdefault(name, {"not on CUDA's lists"})
            return func(*args, **kwargs)
        before = [t.dtype for t in _tensors(args, kwargs)]
        fast = torch.get_autocast_dtype("cuda")
        if entry in self.override:  # provoked: this entry cast to another dtype
            policy, fast = LOWER, self.override[entry]
        if policy == LOWER:
            args, kwargs = _cast(args, fast), {k: _cast(v, fast) for k, v in kwargs.items()}
        elif policy == FP32:
            args, kwargs = _cast(args, torch.float32), {k: _cast(v, torch.float32) for k, v in kwargs.items()}
        elif policy == FP32_SET_OPT_DTYPE:
            given = kwargs.get("dtype") is not None or any(isinstance(a, torch.dtype) for a in args)
            if args and _eligible(args[0]) and not given:
                kwargs = {**kwargs, "dtype": torch.float32}
        else:  # PROMOTE: the widest eligible dtype, starting from the autocast dtype
            dtypes = {fast, *(t.dtype for t in _tensors(args, kwargs))}
            to = torch.float32 if torch.float32 in dtypes else fast
            if len(dtypes - {to}) > 0 and to != torch.float32:
                raise RuntimeError(f"Unexpected floating ScalarType in autocast promote: {dtypes}")
            args, kwargs = _cast(args, to), {k: _cast(v, to) for k, v in kwargs.items()}
        label = f"{policy} ({entry})" + (" OVERRIDDEN" if entry in self.override else "")
        if policy == FP32_SET_OPT_DTYPE:
            after = [kwargs.get("dtype") or t for t in before[:1]] + before[1:]
        else:
            after = [t.dtype for t in _tensors(args, kwargs)]
        _note(name, label, before, after)
        return func(*args, **kwargs)


class CudaAutocast:
    """Stands for ``torch.amp.autocast`` in LeRobot's modules: ``device_type="cuda"`` is emulated on the
    CPU (context manager and decorator, as torch's); any other device type is torch's own autocast."""

    override: ClassVar[dict[str, torch.dtype]] = {}  # set by the driver to provoke a failure

    def __new__(cls, device_type: str, *args, **kwargs):
        if device_type != "cuda":
            return torch.amp.autocast_mode.autocast(device_type, *args, **kwargs)
        return super().__new__(cls)

    def __init__(
        self,
        device_type: str,
        dtype: torch.dtype | None = None,
        enabled: bool = True,
        cache_enabled: bool | None = None,
    ) -> None:
        self.dtype = torch.get_autocast_dtype("cuda") if dtype is None else dtype
        self.enabled = enabled

    def __enter__(self) -> Self:
        self.prev = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
        torch.set_autocast_enabled("cuda", self.enabled)
        torch.set_autocast_dtype("cuda", self.dtype)
        self.mode = _Mode(self.override)
        self.mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.mode.__exit__(*exc)
        torch.set_autocast_enabled("cuda", self.prev[0])
        torch.set_autocast_dtype("cuda", self.prev[1])

    def __call__(self, func: Callable) -> Callable:
        @functools.wraps(func)
        def wrapped(*args, **kwargs):
            with self.__class__("cuda", dtype=self.dtype, enabled=self.enabled):
                return func(*args, **kwargs)

        return wrapped


class _AmpProxy:
    """``torch.amp`` with ``autocast`` replaced."""

    autocast = CudaAutocast

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.amp, name)


class _TorchProxy:
    """``torch`` as the patched modules see it: ``torch.amp.autocast`` is :class:`CudaAutocast`."""

    amp = _AmpProxy()

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


@contextlib.contextmanager
def patched(*modules) -> Iterator[None]:
    """Within the block, ``torch.amp.autocast`` means :class:`CudaAutocast` in ``modules`` (their global
    ``torch`` replaced by a proxy; every other name on it is torch's own)."""
    saved = [module.torch for module in modules]
    for module in modules:
        module.torch = _TorchProxy()
    try:
        yield
    finally:
        for module, original in zip(modules, saved, strict=True):
            module.torch = original


def install(*modules) -> None:
    """:func:`patched` for the rest of the process."""
    for module in modules:
        module.torch = _TorchProxy()


def self_check(disabled_function: Callable[[], torch.Tensor] | None = None) -> None:
    """The emulation's own semantics on small tensors, raising ``AssertionError`` if one is off: in an
    fp32 region a bf16 linear computes as the explicit fp32 one (same values, fp32 result, bf16 weight
    gradient), layer_norm and sum run in fp32, bf16 arithmetic and float64 inputs stay as they are; under
    torch's own ``autocast("cuda", enabled=False)`` nested inside, nothing is cast; outside, nothing either.
    ``disabled_function``: a function decorated ``@torch.amp.autocast("cuda", enabled=False)`` where it was
    defined, which must give the same result inside a region as outside."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 8, generator=g).bfloat16()
    w = torch.randn(5, 8, generator=g).bfloat16().requires_grad_()
    b = torch.randn(5, generator=g).bfloat16()
    expected = F.linear(x.float(), w.float(), b.float())
    expected.sum().backward()
    grad, w.grad = w.grad, None
    with CudaAutocast("cuda", dtype=torch.float32):
        got = F.linear(x, w, b)
        normed = F.layer_norm(x, (8,))
        total = torch.sum(x)
        stays = x + x
        wide = torch.pow(2.0, torch.arange(3, dtype=torch.float64))
        with torch.amp.autocast("cuda", enabled=False):  # torch's own, as LeRobot's decorators
            inner = F.linear(x, w.detach(), b)
        inside = None if disabled_function is None else disabled_function()
    got.sum().backward()
    assert got.dtype == torch.float32 and torch.equal(got, expected), "linear not computed in fp32"
    assert w.grad.dtype == torch.bfloat16 and torch.equal(w.grad, grad), "gradient not cast back"
    assert normed.dtype == torch.float32 and total.dtype == torch.float32, "fp32-list op not in fp32"
    assert stays.dtype == torch.bfloat16 and wide.dtype == torch.float64, "unlisted or float64 op cast"
    assert inner.dtype == torch.bfloat16, "autocast(enabled=False) inside a region still casts"
    assert F.linear(x, w.detach(), b).dtype == torch.bfloat16, "casting outside a region"
    if disabled_function is not None:
        assert torch.equal(inside, disabled_function()), "an enabled=False function differs in a region"
