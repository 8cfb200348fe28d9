"""Installing on a Gaudi image, simulated: a stub `habana_frameworks` on the path.

setup.py runs on a copy of its inputs in a temp dir (it writes vllm/_build_info.py
next to itself: the checkout's own record must never turn into "hpu"), as
`setup.py egg_info`, which computes everything an install would (target, version,
requirements, entry points) and installs nothing. The metadata it writes is then
put on the path of a fresh interpreter, as an installed HPU build, to check what
a user of that build gets at run time (the HPU platform through the plugin).
"""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import textwrap
from importlib.metadata import PackageNotFoundError, requires

import pytest
from packaging.requirements import Requirement

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The stub image: just enough of habana_frameworks for vllm/hpu/habana/real.py to import.
# Nothing in these tests runs a kernel; `is_lazy` reads PT_HPU_LAZY_MODE as the bridge.
STUB_MODULES = {
    "habana_frameworks/__init__.py": "STUB = True\n",
    "habana_frameworks/torch/__init__.py": "from habana_frameworks.torch import core, hpu\n",
    "habana_frameworks/torch/core/__init__.py": "def mark_step(*args, **kwargs): pass\n",
    "habana_frameworks/torch/hpu/__init__.py":
        "def wrap_in_hpu_graph(module, **kwargs): return module\n",
    "habana_frameworks/torch/hpu/metrics.py": "def metric_localcontext(name): pass\n",
    "habana_frameworks/torch/hpex/__init__.py": "",
    "habana_frameworks/torch/hpex/kernels/__init__.py": textwrap.dedent("""\
        class FusedSDPA: pass
        class RotaryPosEmbeddingMode: BLOCKWISE, PAIRWISE = 0, 1
        def apply_rotary_pos_emb(*args): raise NotImplementedError
        """),
    "habana_frameworks/torch/hpex/normalization/__init__.py": "class FusedRMSNorm: pass\n",
    "habana_frameworks/torch/utils/__init__.py": "",
    "habana_frameworks/torch/utils/internal.py": textwrap.dedent("""\
        import os
        def is_lazy(): return os.environ.get("PT_HPU_LAZY_MODE", "0") == "1"
        """),
}
HPU_VARS = ("VLLM_TARGET_DEVICE", "VLLM_USE_FAKE_HPU", "VLLM_PLUGINS", "PT_HPU_LAZY_MODE",
            "PT_HPU_WEIGHT_SHARING", "PT_HPU_ENABLE_LAZY_COLLECTIVES",
            "RUNTIME_SCALE_PATCHING")


def load_setup_module():
    """setup.py as a module (its build runs only under __main__)."""
    spec = importlib.util.spec_from_file_location("vllm_setup", os.path.join(ROOT, "setup.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_stub_image(site_dir) -> str:
    for rel, text in STUB_MODULES.items():
        path = site_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(site_dir)


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in HPU_VARS}
    env.update(extra)
    return env


def egg_info(tmp, site_dir: str, **env: str) -> tuple[str, dict[str, str]]:
    """Run `setup.py egg_info` on a copy of setup.py + requirements/ with `site_dir`
    first on the path; returns (setup's stderr, {metadata file: text})."""
    src, meta = tmp / "src", tmp / "meta"
    shutil.copytree(os.path.join(ROOT, "requirements"), src / "requirements")
    shutil.copy(os.path.join(ROOT, "setup.py"), src / "setup.py")
    (src / "vllm").mkdir()
    (src / "vllm" / "__init__.py").write_text("")
    meta.mkdir()
    proc = subprocess.run([sys.executable, "setup.py", "-q", "egg_info", "--egg-base",
                           str(meta)], cwd=src, capture_output=True, text=True, timeout=300,
                          env=clean_env(PYTHONPATH=site_dir, **env))
    assert proc.returncode == 0, proc.stderr
    info = meta / "vllm.egg-info"
    files = {p.name: p.read_text() for p in info.iterdir()}
    files["_build_info.py"] = (src / "vllm" / "_build_info.py").read_text()
    return proc.stderr, files


def requirement_names(requires_txt: str) -> list[str]:
    """Names in egg-info's requires.txt before the first [extra] section."""
    base = requires_txt.split("\n[", 1)[0]
    return [Requirement(line).name.lower() for line in base.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def stub_site(tmp_path_factory) -> str:
    return write_stub_image(tmp_path_factory.mktemp("site-packages"))


@pytest.fixture(scope="module")
def hpu_build(tmp_path_factory, stub_site):
    """The metadata of a build made on the stub image with VLLM_TARGET_DEVICE unset."""
    own_record = os.path.join(ROOT, "vllm", "_build_info.py")
    before = open(own_record).read() if os.path.exists(own_record) else None
    tmp = tmp_path_factory.mktemp("hpu-build")
    stderr, files = egg_info(tmp, stub_site)
    after = open(own_record).read() if os.path.exists(own_record) else None
    assert before == after, "setup.py in a temp dir rewrote the checkout's _build_info.py"
    return stderr, files, str(tmp / "meta")


def test_gaudi_image_builds_the_hpu_target_without_torch(hpu_build):
    stderr, files, _ = hpu_build
    assert "target hpu (detected)" in stderr and "requirements/hpu.txt" in stderr, stderr
    assert re.search(r"^Version: 0\.1\.0\+gaudi$", files["PKG-INFO"], re.MULTILINE)
    assert "TARGET_DEVICE = 'hpu'" in files["_build_info.py"]
    names = requirement_names(files["requires.txt"])
    assert "neural-compressor-pt" in names and "ray" in names
    assert not {"torch", "torchvision", "torchaudio"} & set(names), names
    # vLLM's plugin groups, for HPU builds only.
    entry_points = files["entry_points.txt"]
    assert "[vllm.platform_plugins]\nhpu = vllm.hpu.plugin:register" in entry_points
    assert ("[vllm.general_plugins]\nhpu_custom_ops = vllm.hpu.plugin:register_ops"
            in entry_points)


def test_explicit_cpu_target_keeps_the_cpu_build(tmp_path, stub_site):
    """VLLM_TARGET_DEVICE wins over detection (scripts/install_cpu.sh relies on it)."""
    stderr, files = egg_info(tmp_path, stub_site, VLLM_TARGET_DEVICE="cpu")
    assert "target cpu (VLLM_TARGET_DEVICE)" in stderr
    assert "torch==2.13.0" in files["requires.txt"].split("\n[", 1)[0]
    assert "vllm.platform_plugins" not in files["entry_points.txt"]
    assert "vllm.general_plugins" not in files["entry_points.txt"]
    assert "TARGET_DEVICE = 'cpu'" in files["_build_info.py"]


def _run_installed(meta: str, stub: str, code: str, **env: str) -> list[str]:
    """`code` in a fresh interpreter that sees the stub image and the HPU build's
    metadata (ahead of this checkout's own install record)."""
    path = os.pathsep.join([stub, meta, ROOT])
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env=clean_env(PYTHONPATH=path, **env))
    assert proc.returncode == 0, proc.stderr
    return [line[len("PROBE "):] for line in proc.stdout.splitlines()
            if line.startswith("PROBE ")]


RUNTIME_PROBE = textwrap.dedent("""\
    import os, sys, torch
    from importlib.metadata import entry_points
    print("PROBE", entry_points(group="vllm.platform_plugins"),
          entry_points(group="vllm.general_plugins"))
    from vllm.platforms import current_platform
    from vllm.plugins import load_general_plugins
    load_general_plugins()
    from vllm.model_executor.layers.layernorm import RMSNorm
    print("PROBE", current_platform.device_name, current_platform.is_fake,
          RMSNorm(8).forward_method_name)
    names = ("PT_HPU_WEIGHT_SHARING", "PT_HPU_ENABLE_LAZY_COLLECTIVES", "RUNTIME_SCALE_PATCHING")
    print("PROBE", [os.environ.get(k) for k in names], torch._dynamo.config.disable)
    """)


def test_installed_hpu_build_selects_the_hpu_platform_through_its_plugin(hpu_build, stub_site):
    """Lazy mode (HPU graphs): the docs' verification snippet lists both entry points,
    the platform is the real (not fake) HPU with no flag set, the HPU kernels are
    bound, and the plugin applied Gaudi's settings."""
    meta = hpu_build[2]
    listing, platform, settings = _run_installed(meta, stub_site, RUNTIME_PROBE,
                                                 PT_HPU_LAZY_MODE="1")
    assert "name='hpu', value='vllm.hpu.plugin:register'" in listing
    assert "name='hpu_custom_ops', value='vllm.hpu.plugin:register_ops'" in listing
    assert platform == "hpu False rms_norm_hpu"
    assert settings == "['0', 'true', None] True"


def test_installed_hpu_build_compile_mode_keeps_user_settings(hpu_build, stub_site):
    meta = hpu_build[2]
    _, platform, settings = _run_installed(meta, stub_site, RUNTIME_PROBE,
                                           PT_HPU_LAZY_MODE="0", PT_HPU_WEIGHT_SHARING="1")
    assert platform == "hpu False rms_norm_hpu"
    assert settings == "['1', None, '1'] False"


def test_installed_hpu_build_runs_on_cpu_without_gaudi_code(hpu_build, stub_site):
    """VLLM_TARGET_DEVICE=cpu at run time: the plugin stands aside and nothing of the
    HPU stack (the shim vllm.hpu.habana, habana_frameworks) is imported by building the
    layers (the entry point itself lives in vllm.hpu.plugin, which imports neither)."""
    code = textwrap.dedent("""\
        import sys
        from vllm.platforms import current_platform
        from vllm.plugins import load_general_plugins
        load_general_plugins()
        from vllm.model_executor.layers.layernorm import RMSNorm
        from vllm.model_executor.layers.rotary_embedding import get_rope
        names = [RMSNorm(8).forward_method_name, get_rope(8, 8, 16, 10000.0).forward_method_name]
        print("PROBE", current_platform.device_name, names,
              [m for m in ("vllm.hpu.habana", "habana_frameworks") if m in sys.modules])
        """)
    out = _run_installed(hpu_build[2], stub_site, code, VLLM_TARGET_DEVICE="cpu")
    assert out[-1] == "cpu ['rms_norm_cpu', 'rotary_embedding_cpu'] []"


def test_detection_sees_site_packages_hidden_by_build_isolation(tmp_path, monkeypatch):
    """pip builds in an isolated environment whose sys.path lacks site-packages;
    detection still finds habana_frameworks through `site`."""
    setup = load_setup_module()
    site_dir = write_stub_image(tmp_path / "site-packages")
    monkeypatch.setattr(setup, "nvidia_gpu_listed", lambda: False)
    monkeypatch.setattr(sys, "path", [str(tmp_path / "isolated")])
    monkeypatch.setattr(setup.site, "getsitepackages", lambda: [site_dir])
    assert setup.detect_target_device() == "hpu"
    monkeypatch.setattr(setup.site, "getsitepackages", lambda: [])
    monkeypatch.setattr(setup.site, "getusersitepackages", lambda: str(tmp_path / "none"))
    monkeypatch.setattr(setup.sysconfig, "get_paths",
                        lambda: {"purelib": str(tmp_path), "platlib": str(tmp_path)})
    assert setup.detect_target_device() == "cpu"


@pytest.mark.parametrize("version_py, expect", [
    ("cuda: Optional[str] = '12.8'\n", "cuda"),
    ("cuda = '11.8'\n", "cuda"),
    ("cuda: Optional[str] = None\n", "cpu"),
])
def test_detection_of_a_cuda_torch(tmp_path, monkeypatch, version_py, expect):
    setup = load_setup_module()
    monkeypatch.setattr(setup, "nvidia_gpu_listed", lambda: False)
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("")
    (tmp_path / "torch" / "version.py").write_text("__version__ = '2.9.0'\n" + version_py)
    assert setup.detect_target_device([str(tmp_path)]) == expect
    monkeypatch.setattr(setup, "nvidia_gpu_listed", lambda: True)
    assert setup.detect_target_device([str(tmp_path)]) == "cuda"
    write_stub_image(tmp_path)  # Gaudi first: its image ships its own torch
    assert setup.detect_target_device([str(tmp_path)]) == "hpu"


def test_invalid_target_names_the_variable(monkeypatch):
    setup = load_setup_module()
    monkeypatch.setenv("VLLM_TARGET_DEVICE", "tpu")
    with pytest.raises(ValueError, match="VLLM_TARGET_DEVICE='tpu'"):
        setup.target_device()


def _image_torch_version() -> str:
    """The oldest torch of the Gaudi images Dockerfile.hpu builds on (its default)."""
    text = open(os.path.join(ROOT, "Dockerfile.hpu")).read()
    return re.search(r"^ARG TORCH_VERSION=(\S+)$", text, re.MULTILINE).group(1)


def _torch_requirements(name: str, seen: set[str]) -> list[str]:
    """Every `torch` requirement reachable from installed distribution `name`."""
    if name in seen:
        return []
    seen.add(name)
    try:
        reqs = [Requirement(r) for r in requires(name) or []]
    except PackageNotFoundError:
        return []
    found = []
    for req in reqs:
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        if req.name.lower() == "torch":
            found.append(f"{name}: {req}")
        else:
            found += _torch_requirements(req.name.lower(), seen)
    return found


def test_hpu_requirements_accept_the_images_torch():
    """No requirement of the HPU build, direct or (where installed here) transitive,
    asks for a torch the Gaudi image's own build does not satisfy: pip would
    otherwise replace it with a CPU wheel."""
    setup = load_setup_module()
    image_torch = _image_torch_version()
    seen: set[str] = set()
    for line in setup.read_requirements("hpu.txt"):
        req = Requirement(line)
        assert req.name.lower() not in ("torch", "torchvision", "torchaudio"), line
        for torch_req in _torch_requirements(req.name.lower(), seen):
            spec = Requirement(torch_req.split(": ", 1)[1]).specifier
            assert spec.contains(image_torch, prereleases=True), (torch_req, image_torch)
    assert "accelerate" in seen  # the walk did reach the one known torch dependent


def test_dockerfile_builds_hpu_without_the_demo_model():
    text = open(os.path.join(ROOT, "Dockerfile.hpu")).read()
    assert "smollm" not in text.lower()
    assert "VLLM_TARGET_DEVICE=hpu" in text and "pip install -e ." in text
