"""The docs' examples run: every Python and shell block of docs/ runs here on CPU, or is
marked with what it needs (docs/examples.py; how: docs/developing/docs.md).

One server per distinct `<!-- docs-server: ... -->` set (the default model), one
process for every page's Python blocks (engines shared between identical `LLM(...)`
calls), shell blocks one by one; a small KV cache and the Hub offline throughout.
"""
from __future__ import annotations

import glob
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "docs_block_runner.py")


def _load_examples():
    spec = importlib.util.spec_from_file_location("docs_examples",
                                                  os.path.join(ROOT, "docs", "examples.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules["docs_examples"] = module
    spec.loader.exec_module(module)
    return module


examples = _load_examples()
PAGES = {os.path.relpath(p, ROOT): examples.parse(open(p).read(), os.path.relpath(p, ROOT))
         for p in sorted(glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))}
RUN_PAGES = [p for p, page in PAGES.items() if any(b.runs for b in page.blocks)]

ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "0.25",   # 256 MiB per engine: the examples are tiny
    "HF_HUB_OFFLINE": "1",              # an unmarked block needing the Hub fails at once
    "TOKENIZERS_PARALLELISM": "false",
    "PYTHONUNBUFFERED": "1",
}


def _bash_prelude(url: str | None) -> str:
    """curl fails on HTTP errors (a 400 is a broken example); `vllm chat|complete` and
    `localhost:8000` reach the page's server."""
    lines = ['curl() { command curl --fail-with-body --silent --show-error --max-time 120 "$@"; }']
    if url:
        lines.append('vllm() { case "$1" in chat|complete) command vllm "$@" --url '
                     f'"{url}/v1";; *) command vllm "$@";; esac; }}')
    return "\n".join(lines) + "\n"


def run_bash_block(block, cwd: str, url: str | None, env: dict[str, str],
                   timeout_s: float = 300.0) -> str | None:
    """None when the block behaved (ran, or failed when it should), else why not."""
    code = block.code
    started = time.monotonic()
    if url:
        code = (code.replace("http://localhost:8000", url)
                .replace("localhost:8000", url.split("//", 1)[1]))
    try:
        proc = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", _bash_prelude(url) + code],
                              cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout_s} s"
    finally:
        print(f"[docs] {block.where}: {time.monotonic() - started:.1f} s")
    if block.expect_failure:
        return None if proc.returncode != 0 else "expected to fail, but it ran"
    if proc.returncode != 0:
        return f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return None


def run_python_pages(pages: list[dict], env: dict[str, str], timeout_s: float = 900.0
                     ) -> dict[str, str | None]:
    with tempfile.TemporaryDirectory(prefix="docs-py-") as tmp:
        spec, out = os.path.join(tmp, "pages.json"), os.path.join(tmp, "results.json")
        with open(spec, "w") as f:
            json.dump(pages, f)
        proc = subprocess.run([sys.executable, RUNNER, spec, out], env=env, cwd=tmp,
                              capture_output=True, text=True, timeout=timeout_s)
        print(proc.stdout[-20000:])
        if not os.path.exists(out):
            raise RuntimeError(f"the block runner died (exit {proc.returncode}):\n"
                               f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
        with open(out) as f:
            results = json.load(f)
    for page in pages:
        for block in page["blocks"]:
            results.setdefault(block["where"], "not run (runner stopped)")
    return results


def _env() -> dict[str, str]:
    env = dict(os.environ, **ENV)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _options(flags: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """`--flag value...` groups of a flag list."""
    options: dict[str, tuple[str, ...]] = {}
    name = None
    for word in flags:
        if word.startswith("-"):
            name = word
            options[name] = ()
        elif name is not None:
            options[name] += (word,)
    return options


def merge_servers(configs) -> dict:
    """Page server config -> the config of the server it runs on: pages whose flags and
    variables do not disagree (no flag or variable given two values) share one server,
    started with all of them (each page's own are a subset)."""
    merged: list[tuple[dict, dict, list]] = []    # (options, env, member configs)
    for config in sorted(configs):
        flags, env = _options(config[0]), dict(config[1])
        for options, menv, members in merged:
            if all(options.get(k, v) == v for k, v in flags.items()) and \
                    all(menv.get(k, v) == v for k, v in env.items()):
                options.update(flags)
                menv.update(env)
                members.append(config)
                break
        else:
            merged.append((dict(flags), dict(env), [config]))
    out = {}
    for options, env, members in merged:
        server = (tuple(w for k, v in options.items() for w in (k, *v)),
                  tuple(sorted(env.items())))
        out.update({m: server for m in members})
    return out


@pytest.fixture(scope="module")
def results():
    """Every runnable block's outcome: {where: None or the failure}."""
    from tests.entrypoints.conftest import RemoteServer
    env = _env()
    page_configs = {PAGES[p].server for p in RUN_PAGES if PAGES[p].server is not None}
    runs_on = merge_servers(page_configs)
    configs = set(runs_on.values())
    servers, outcome = {}, {}
    started = time.monotonic()
    try:
        from concurrent.futures import ThreadPoolExecutor
        server_env = {k: v for k, v in ENV.items() if k != "PYTHONUNBUFFERED"}  # it sets that

        def start(config):
            flags, extra_env = config
            return config, RemoteServer(list(flags), env={**server_env, **dict(extra_env)})

        with ThreadPoolExecutor(max(1, len(configs))) as pool:   # they start side by side
            futures = [pool.submit(start, c) for c in configs]
        for future in futures:          # all have finished: keep every started one
            if future.exception() is None:
                config, srv = future.result()
                servers[config] = srv
        for future in futures:
            future.result()             # a server that failed to start fails the test
        with tempfile.TemporaryDirectory(prefix="docs-examples-") as tmp:
            py_pages, own = [], []
            for i, path in enumerate(RUN_PAGES):
                page = PAGES[path]
                url = servers[runs_on[page.server]].url if page.server is not None else None
                cwd = os.path.join(tmp, f"page{i}")
                os.makedirs(cwd)
                blocks = [b for b in page.blocks if b.runs]
                py = [b for b in blocks if b.lang in ("python", "py")]
                if py:
                    (own if page.own_process else py_pages).append({
                        "page": path, "cwd": cwd, "url": url, "blocks": [
                        {"where": b.where, "code": b.code, "expect_failure": b.expect_failure}
                        for b in py]})
                for b in blocks:
                    if b.lang not in ("python", "py"):
                        outcome[b.where] = run_bash_block(b, cwd, url, env)
            outcome.update(run_python_pages(py_pages, env))
            for alone in own:
                outcome.update(run_python_pages([alone], env))
    finally:
        for srv in servers.values():
            srv.stop()
    print(f"\n[docs] {len(outcome)} blocks on {len(RUN_PAGES)} pages, {len(configs)} "
          f"server(s), {time.monotonic() - started:.0f} s")
    return outcome


def test_markers_name_what_a_block_needs():
    errors = [e for page in PAGES.values() for e in page.errors]
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("path", RUN_PAGES)
def test_page_examples_run(path, results):
    import shutil
    if shutil.which("curl") is None and any(
            b.runs and b.lang not in ("python", "py") and "curl" in b.code
            for b in PAGES[path].blocks):
        pytest.skip("the page's shell examples use curl, which is not installed")
    failures = {b.where: results.get(b.where, "not run") for b in PAGES[path].blocks if b.runs}
    failures = {k: v for k, v in failures.items() if v}
    assert not failures, "\n\n".join(f"{k}: {v}" for k, v in failures.items())


BROKEN_PAGE = """# A page with mistakes

```python
x = 1
```

```python
raise ValueError("a broken example")
```

```bash
false
```

<!-- needs: -->
```bash
echo a marker without a reason
```

<!-- needs: a-quantum-computer -->
```bash
echo an unknown reason
```

<!-- needs: gaudi -->
```bash
exit 1   # not run
```

<!-- expect-failure -->
```bash
true
```
"""


def test_a_broken_block_fails_the_check(tmp_path):
    page = examples.parse(BROKEN_PAGE, "broken.md")
    assert any("without a reason" in e for e in page.errors)
    assert any("unknown reason 'a-quantum-computer'" in e for e in page.errors)
    gaudi = next(b for b in page.blocks if b.needs == ["gaudi"])
    assert not gaudi.runs
    env = _env()
    bash = [b for b in page.blocks if b.runs and b.lang == "bash"]
    outcomes = [run_bash_block(b, str(tmp_path), None, env) for b in bash]
    assert outcomes[0] and outcomes[0].startswith("exit 1")         # `false`
    assert outcomes[-1] == "expected to fail, but it ran"            # expect-failure
    py = [b for b in page.blocks if b.runs and b.lang == "python"]
    got = run_python_pages([{"page": "broken.md", "cwd": str(tmp_path), "url": None,
                             "blocks": [{"where": b.where, "code": b.code,
                                         "expect_failure": False} for b in py]}], env)
    assert got[py[0].where] is None
    assert "ValueError: a broken example" in got[py[1].where]
    # The site shows the marker to the reader.
    assert 'Needs: an Intel Gaudi machine' in examples.render_markers(BROKEN_PAGE)


def test_curl_fails_on_an_http_error(tmp_path):
    """The harness's curl turns a 4xx into a failed block (a bare curl exits 0)."""
    import functools
    import http.server
    import threading
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}/missing"
        block = examples.parse(f"```bash\ncurl {url}\n```\n").blocks[0]
        assert "404" in (run_bash_block(block, str(tmp_path), None, _env()) or "")
        bare = subprocess.run(["curl", "-s", url], capture_output=True)
        assert bare.returncode == 0
    finally:
        httpd.shutdown()


def test_pages_share_servers_unless_their_flags_disagree():
    a = (("--scheduling-policy", "priority"), ())
    b = (("--enable-auto-tool-choice", "--tool-call-parser", "hermes"), ())
    c = (("--tool-call-parser", "pythonic"), ())
    d = ((), (("VLLM_SERVER_DEV_MODE", "1"),))
    runs_on = merge_servers({a, b, c, d})
    assert runs_on[a] == runs_on[b] == runs_on[d] != runs_on[c]
    flags, env = runs_on[a]
    assert "--scheduling-policy" in flags and "hermes" in flags and env == d[1]
