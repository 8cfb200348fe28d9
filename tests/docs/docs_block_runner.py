"""Run the docs' Python blocks: `python docs_block_runner.py pages.json results.json`.

pages.json: [{"page", "cwd", "url" (or null), "blocks": [{"where", "code",
"expect_failure"}]}]. Each page's blocks run in order in one namespace (as a reader
running the page would), each page in a fresh one and its own directory; `localhost:8000`
is replaced by the page's server. `LLM(...)` called again with the same arguments
returns the engine built before (starting engines would be most of the time spent).
results.json: {where: null (ran as expected) or the failure's text}.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback


_ENGINES: dict[str, object] = {}
_DEFAULT = repr(((), []))   # LLM(): kept for every page that asks for it


def _release_engines() -> None:
    """Shut the page's other engines down (their KV caches add up over the pages)."""
    for key in [k for k in _ENGINES if k != _DEFAULT]:
        engine = getattr(_ENGINES.pop(key), "llm_engine", None)
        try:
            engine.shutdown()
        except Exception:  # noqa: BLE001 - best effort; the process exits at the end
            pass


def _share_engines() -> None:
    import vllm
    from vllm.entrypoints import llm as llm_module
    real = llm_module.LLM
    cache = _ENGINES

    def LLM(*args, **kwargs):  # noqa: N802 - stands in for the class
        key = repr((args, sorted(kwargs.items())))
        if key not in cache:
            cache[key] = real(*args, **kwargs)
        return cache[key]

    vllm.LLM = LLM
    llm_module.LLM = LLM


BLOCK_TIMEOUT_S = 240


def _timeout(signum, frame):  # noqa: ARG001 - signal handler
    raise TimeoutError(f"the block ran for more than {BLOCK_TIMEOUT_S} s (unbounded "
                       "generation? give examples a small max_tokens)")


def main() -> None:
    signal.signal(signal.SIGALRM, _timeout)
    with open(sys.argv[1]) as f:
        pages = json.load(f)
    if any("LLM(" in b["code"] for p in pages for b in p["blocks"]):
        _share_engines()
    results: dict[str, object] = {}
    for page in pages:
        os.chdir(page["cwd"])
        namespace = {"__name__": "__main__"}
        failed = None
        for block in page["blocks"]:
            where, code = block["where"], block["code"]
            if failed is not None:
                results[where] = f"not run: an earlier block of the page failed ({failed})"
                continue
            if page["url"]:
                code = (code.replace("http://localhost:8000", page["url"])
                        .replace("localhost:8000", page["url"].split("//", 1)[1]))
            print(f"\n===== {where} =====", flush=True)
            start = time.monotonic()
            signal.alarm(BLOCK_TIMEOUT_S)
            try:
                exec(compile(code, where, "exec"), namespace)  # noqa: S102 - the docs' examples
                error = None
            except BaseException:  # noqa: BLE001 - SystemExit and all: report the block
                error = traceback.format_exc(limit=-8)
            finally:
                signal.alarm(0)
            print(f"\n----- {where}: {time.monotonic() - start:.1f} s", flush=True)
            if block["expect_failure"]:
                results[where] = None if error else "expected to fail, but it ran"
            else:
                results[where] = error
                if error:
                    failed = where
        _release_engines()
    with open(sys.argv[2], "w") as f:
        json.dump(results, f)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # engines the examples left running need no orderly shutdown here


if __name__ == "__main__":
    main()
