"""The CPU platform binds its native kernels when the first layer is built, not when the
platform is read: a server's frontend (which builds no layer) never imports them, nor
torch._dynamo through their custom-op registration."""
from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CODE = """
import sys
from vllm.platforms import current_platform
assert current_platform.is_cpu() and current_platform.supported_dtypes
print("after platform:", "vllm.cpu.ops" in sys.modules, "torch._dynamo" in sys.modules)
from vllm.model_executor.layers.layernorm import RMSNorm
layer = RMSNorm(8)
print("after layer:", "vllm.cpu.ops" in sys.modules, layer.forward_method_name)
"""


def test_native_ops_are_bound_when_the_first_layer_is_built():
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               VLLM_TARGET_DEVICE="cpu")
    env.pop("VLLM_USE_FAKE_HPU", None)
    out = subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert "after platform: False False" in lines, out.stdout
    assert "after layer: True rms_norm_cpu" in lines, out.stdout
