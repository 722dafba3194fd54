"""The Hugging Face Hub, asked once and quickly: offline settings and a reachability probe.

A machine with no route to the Hub should hear so in seconds, in one line, instead of sitting
through huggingface_hub's and datasets' retry loops.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request

PROBE_TIMEOUT = 3.0  # seconds to wait for the Hub before saying it cannot be reached
TRUE = ("1", "ON", "YES", "TRUE")


def hub_offline(*names: str) -> bool:
    """True when HF_HUB_OFFLINE (or another of `names`, e.g. HF_DATASETS_OFFLINE) is set."""
    values = (os.environ.get(name, "").strip().upper() for name in ("HF_HUB_OFFLINE", *names))
    return any(v in TRUE for v in values)


def hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co")


def hub_unreachable(timeout: float = PROBE_TIMEOUT) -> str | None:
    """Why the Hub endpoint cannot be reached within `timeout` seconds, or None when it can
    (any HTTP answer counts; proxies are respected)."""
    endpoint = hub_endpoint()
    try:
        urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=timeout)
    except urllib.error.HTTPError:
        return None  # it answered
    except urllib.error.URLError as exc:
        return f"{endpoint}: {exc.reason}"
    except (OSError, ValueError) as exc:
        return f"{endpoint}: {exc}"
    return None
