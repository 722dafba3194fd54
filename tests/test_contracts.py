"""The contract kit over every built-in plugin (and the test doubles)."""

from dllmbench.testing.contracts import *  # noqa: F403
