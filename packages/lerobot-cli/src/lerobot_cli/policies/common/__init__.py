"""What several policies share, so that no policy package imports another (LeRobot keeps its shared
policy helpers beside the policies too, not inside one of them).

Each module has one job: ``flow_matching`` (the flow time embedding, noise and time draws, the Euler
loop), ``masks`` (big_vision's block attention masks), ``tensors`` (padding), ``prompts`` (the task-text
newline step), ``presets`` (AdamW with cosine decay from a policy's fields), ``chunked_policy`` (the
action queue, chunk inference and language inputs of the VLA policies). ``paligemma/`` is the
PaliGemma-with-expert flow policy pi0 and pi05 both subclass. A policy folder may import from here and
from the top-level ``lerobot_cli.policies`` modules, never from another policy's folder, and nothing here
imports a policy folder (``tests/test_import_dag.py`` checks both).
"""
