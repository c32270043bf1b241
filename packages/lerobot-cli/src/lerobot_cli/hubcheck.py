"""Can the final policy be published? Asked at start-up, so a long run never fails at its last step.

``--policy.repo_id`` uploads after the final checkpoint. Offline mode, a missing or rejected token
and an unreachable Hub are all knowable before step 1; each is refused with one sentence that says
how to train anyway (``--policy.push_to_hub=false``, then publish later with
``lerobot-convert-dcp --push_to_hub``). Torch-free; the main rank asks, once.
"""

from __future__ import annotations

from lerobot_cli.cli.errors import UsageError


def wants_publish(cfg) -> bool:
    """Whether the run uploads its final policy (``--policy.repo_id`` with ``push_to_hub``)."""
    return bool(cfg.policy is not None and cfg.policy.repo_id and cfg.policy.push_to_hub)


_LATER = (
    "or pass --policy.push_to_hub=false to train without publishing (publish the checkpoint later with "
    "lerobot-convert-dcp --checkpoint_dir=… --push_to_hub …)"
)


def check_publish_target(repo_id: str) -> str:
    """The Hub user the upload would run as; raises UsageError when the upload could not happen."""
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import HfHubHTTPError, LocalTokenNotFoundError

    flag = f"--policy.repo_id={repo_id}"
    if constants.HF_HUB_OFFLINE:
        raise UsageError(
            f"{flag} publishes the final policy to the Hub, but HF_HUB_OFFLINE is set: unset it, {_LATER}"
        )
    try:
        who = HfApi().whoami()
    except LocalTokenNotFoundError:
        raise UsageError(
            f"{flag} publishes the final policy, but no Hugging Face token is configured: run "
            f"`hf auth login` or set HF_TOKEN, {_LATER}"
        ) from None
    except HfHubHTTPError as exc:
        status = getattr(getattr(exc, "response", None), "status_code", None)
        why = "the Hugging Face token was rejected" if status in (401, 403) else f"the Hub answered {status}"
        raise UsageError(
            f"{flag} publishes the final policy, but {why}: fix the token (`hf auth login`), {_LATER}"
        ) from None
    except Exception as exc:  # noqa: BLE001 - any transport failure: the Hub cannot be reached from here
        detail = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
        raise UsageError(
            f"{flag} publishes the final policy, but the Hub cannot be reached ({detail}): check the "
            f"network, {_LATER}"
        ) from None
    return str(who.get("name", "?")) if isinstance(who, dict) else "?"
