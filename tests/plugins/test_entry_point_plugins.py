"""Out-of-tree platforms and general plugins, installed as real entry points in a test.

A distribution is "installed" by putting a `*.dist-info` folder with an
`entry_points.txt` next to its module in a temporary directory on sys.path, which
is all `importlib.metadata` needs to find it.
"""
from __future__ import annotations

import importlib
import os
import subprocess
import sys
import textwrap

import pytest

import vllm.plugins
from vllm.platforms import _reset_current_platform, current_platform

MODULE = "vllm_test_dummy_plugin"

PLUGIN_SOURCE = textwrap.dedent('''
    import os

    from vllm.cpu.platform import CpuPlatform
    from vllm.platforms.interface import PlatformEnum

    GENERAL_CALLS = []
    ORDER = []


    class DummyAccelPlatform(CpuPlatform):
        _enum = PlatformEnum.OOT
        device_name = "dummy-accel"

        def default_block_size(self):
            return 64


    def register_platform():
        """Activate only where the (pretend) device exists."""
        ORDER.append("platform")
        return None if os.environ.get("DUMMY_ACCEL_ABSENT") else f"{__name__}.DummyAccelPlatform"


    def register_absent_platform():
        return None


    def register_general():
        ORDER.append("general")
        GENERAL_CALLS.append(os.getpid())
''')

ENTRY_POINTS = textwrap.dedent(f'''
    [vllm.platform_plugins]
    dummy_accel = {MODULE}:register_platform
    absent_accel = {MODULE}:register_absent_platform

    [vllm.general_plugins]
    dummy_general = {MODULE}:register_general
''')


@pytest.fixture
def installed_plugin(tmp_path, monkeypatch):
    (tmp_path / f"{MODULE}.py").write_text(PLUGIN_SOURCE)
    dist = tmp_path / f"{MODULE}-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {MODULE}\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(ENTRY_POINTS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    monkeypatch.delenv("DUMMY_ACCEL_ABSENT", raising=False)
    monkeypatch.setattr(vllm.plugins, "_general_plugins_loaded", False)
    _reset_current_platform()
    yield importlib.import_module(MODULE)
    sys.modules.pop(MODULE, None)
    _reset_current_platform()


def test_platform_plugin_is_selected(installed_plugin, monkeypatch):
    monkeypatch.setenv("VLLM_TARGET_DEVICE", "cpu")  # an activated plugin still wins
    assert vllm.plugins.load_platform_plugin() == f"{MODULE}.DummyAccelPlatform"
    assert current_platform.device_name == "dummy-accel"
    assert current_platform.is_out_of_tree()
    assert current_platform.default_block_size() == 64


def test_platform_plugin_absent_device_or_filtered(installed_plugin, monkeypatch):
    monkeypatch.setenv("VLLM_TARGET_DEVICE", "cpu")
    monkeypatch.setenv("DUMMY_ACCEL_ABSENT", "1")
    assert vllm.plugins.load_platform_plugin() is None
    assert current_platform.device_name == "cpu"
    monkeypatch.delenv("DUMMY_ACCEL_ABSENT")
    monkeypatch.setenv("VLLM_PLUGINS", "dummy_general")  # the platform is filtered out
    _reset_current_platform()
    assert current_platform.device_name == "cpu"


def test_general_plugin_runs_once(installed_plugin):
    assert installed_plugin.GENERAL_CALLS == []
    vllm.plugins.load_general_plugins()
    vllm.plugins.load_general_plugins()
    assert len(installed_plugin.GENERAL_CALLS) == 1


def test_general_plugins_honour_vllm_plugins(installed_plugin, monkeypatch):
    monkeypatch.setenv("VLLM_PLUGINS", "dummy_accel")
    vllm.plugins.load_general_plugins()
    assert installed_plugin.GENERAL_CALLS == []


def test_vllm_plugins_set_but_empty_loads_none(installed_plugin, monkeypatch):
    """vLLM reads VLLM_PLUGINS="" as an empty list of names: no plugin at all (unset
    loads every plugin)."""
    monkeypatch.setenv("VLLM_TARGET_DEVICE", "cpu")
    monkeypatch.setenv("VLLM_PLUGINS", "")
    assert vllm.plugins.load_platform_plugin() is None
    vllm.plugins.load_general_plugins()
    assert installed_plugin.GENERAL_CALLS == []


def test_a_fresh_process_loads_the_platform_plugin_first(installed_plugin, tmp_path):
    """Seed 002 (vLLM's plugin docs): the platform plugin, then the general plugins. A
    spawned worker's first call is `load_general_plugins` (create_worker), which ran
    the general plugins before any platform plugin (issue 54)."""
    code = ("import vllm.plugins, vllm_test_dummy_plugin as m; "
            "vllm.plugins.load_general_plugins(); print('ORDER', m.ORDER)")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_PLUGINS", "DUMMY_ACCEL_ABSENT")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), root, env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "ORDER ['platform', 'general']" in out.stdout
