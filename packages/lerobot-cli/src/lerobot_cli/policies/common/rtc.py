"""LeRobot's ``rtc_config`` (real-time chunking) as the VLA configs keep it: accepted off, refused on.

Real-time chunking is an inference feature of LeRobot's pi0, pi05 and SmolVLA that this stack does not
implement. The field stays in the configs so that LeRobot's ``config.json`` loads; a value LeRobot would
refuse (a key its ``RTCConfig`` lacks) is refused here too, and one that switches it on is refused rather
than silently ignored.
"""

from __future__ import annotations

from typing import Any

# LeRobot's RTCConfig fields: config.json's rtc_config may hold no other key (LeRobot refuses the file).
RTC_FIELDS = (
    "enabled",
    "prefix_attention_schedule",
    "max_guidance_weight",
    "execution_horizon",
    "debug",
    "debug_maxlen",
)


def check_rtc_config(rtc_config: dict[str, Any] | None) -> None:
    """A ``ValueError`` in one line for an ``rtc_config`` LeRobot would refuse or that switches it on."""
    if rtc_config is None:
        return
    unknown = sorted(set(rtc_config) - set(RTC_FIELDS))
    if unknown:
        raise ValueError(
            f"--policy.rtc_config: unknown keys {', '.join(unknown)} (LeRobot's RTCConfig has "
            f"{', '.join(RTC_FIELDS)})"
        )
    # A missing "enabled" is true to LeRobot (RTCConfig's default): {} means real-time chunking on.
    if rtc_config.get("enabled", True):
        raise ValueError(
            "--policy.rtc_config with enabled=true (LeRobot's default when the key is missing) is not "
            "supported here (real-time chunking is an inference feature of LeRobot); set it to null"
        )
