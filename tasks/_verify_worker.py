"""The math-verify worker: one process that grades answers, one JSON line in, one out.

Not imported by the harness: `dllmbench.tasks.mathverify` starts it as `python -c SOURCE` and
kills it when a grade runs past its time limit, so a pathological answer costs one restart.
Request: {"gold": str, "answer": str, "timeout": seconds}. Reply: {"ok": bool} or
{"ok": false, "error": str}. The first line it writes is {"ready": true}.
"""

from __future__ import annotations

import json
import math
import resource
import sys


def _limit_memory(megabytes: int) -> None:
    if megabytes > 0:
        limit = megabytes * 1024 * 1024
        _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def main() -> None:
    if "" in sys.path:
        sys.path.remove("")
    from math_verify import parse, verify

    _limit_memory(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    out = sys.stdout
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        try:
            request = json.loads(line)
            # math-verify's own (signal) timeouts end most slow grades cleanly; the parent
            # kills this process for the rest
            seconds = max(1, math.ceil(float(request["timeout"])))
            gold = parse(f"$\\boxed{{{request['gold']}}}$", parsing_timeout=seconds)
            answer = parse(f"$\\boxed{{{request['answer']}}}$", parsing_timeout=seconds)
            ok = bool(verify(gold, answer, timeout_seconds=seconds))
            reply = {"ok": ok}
        except BaseException as exc:  # a grade that raises counts as wrong
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:500]}
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
