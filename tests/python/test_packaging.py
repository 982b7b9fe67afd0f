"""`pip install --no-build-isolation ./python` (offline) gives a package with
the generated stubs and wsync._native (taken from this CMake build)."""
import os
import subprocess
import sys

from harness import BUILD, ROOT


def test_pip_install_offline(tmp_path):
    target = tmp_path / "site"
    env = dict(os.environ, WSYNC_BUILD_DIR=BUILD, PIP_NO_INDEX="1")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-build-isolation",
                    "--no-deps", "--target", str(target), os.path.join(ROOT, "python")],
                   check=True, env=env, timeout=180, cwd=tmp_path)
    code = ("import wsync, wsync.vllm, wsync.torch, wsync.aio, wsync.layouts\n"
            "from wsync.v1 import controller_pb2_grpc, worker_local_pb2\n"
            "assert wsync.__file__.startswith(%r), wsync.__file__\n"
            "s = wsync.vllm.destination({'model_type': 'qwen3', 'hidden_size': 64, "
            "'intermediate_size': 96, 'num_hidden_layers': 1, 'num_attention_heads': 8, "
            "'num_key_value_heads': 2, 'head_dim': 8, 'vocab_size': 100}, tp=2)\n"
            "import wsync.embedded\n"
            "assert 'host' in wsync.embedded.backends(), wsync.embedded.backends()\n"
            "print(len(s.destination.tensors))\n" % str(target))
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True, env=dict(os.environ, PYTHONPATH=str(target)), timeout=60,
                         cwd=tmp_path)
    assert out.stdout.strip() == "11"
