"""Build hooks of the wsync package (metadata: pyproject.toml).

build_py adds what is generated, never checked in:
  * wsync/v1/*_pb2.py, *_pb2_grpc.py: protoc + grpc_python_plugin
    (Debian's protobuf-compiler-grpc) over ../proto/wsync/v1/*.proto;
  * wsync/_native*.so: the CMake target wsync_native (layout builders and the
    embedded worker). Taken from
    $WSYNC_BUILD_DIR/python/wsync when that build has it, else built with CMake
    in python/build/cmake ($WSYNC_SKIP_NATIVE=1: leave it out; wsync.vllm then
    cannot be used).
"""
import glob
import os
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _stubs(out_dir):
    plugin = shutil.which("grpc_python_plugin")
    protoc = shutil.which("protoc")
    if not plugin or not protoc:
        raise RuntimeError("protoc and grpc_python_plugin are needed (Debian: "
                           "protobuf-compiler protobuf-compiler-grpc)")
    protos = sorted(glob.glob(os.path.join(ROOT, "proto", "wsync", "v1", "*.proto")))
    subprocess.run([protoc, f"--proto_path={os.path.join(ROOT, 'proto')}",
                    f"--python_out={out_dir}", f"--grpc_python_out={out_dir}",
                    f"--plugin=protoc-gen-grpc_python={plugin}", *protos], check=True)
    open(os.path.join(out_dir, "wsync", "v1", "__init__.py"), "a").close()


def _native(out_dir):
    if os.environ.get("WSYNC_SKIP_NATIVE") == "1":
        return
    build = os.environ.get("WSYNC_BUILD_DIR")
    found = glob.glob(os.path.join(build, "python", "wsync", "_native*.so")) if build else []
    if not found:
        build = os.path.join(HERE, "build", "cmake")
        launcher = (["-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"] if shutil.which("ccache") else [])
        subprocess.run(["cmake", "-S", ROOT, "-B", build, "-DCMAKE_BUILD_TYPE=Release",
                        "-DWSYNC_BUILD_TESTS=OFF", "-DWSYNC_BUILD_PYTHON=ON", *launcher],
                       check=True)
        subprocess.run(["cmake", "--build", build, "--target", "wsync_native"], check=True)
        found = glob.glob(os.path.join(build, "python", "wsync", "_native*.so"))
    if not found:
        raise RuntimeError("wsync._native was not built (is pybind11-dev installed?)")
    shutil.copy2(found[0], os.path.join(out_dir, "wsync"))


class BuildPy(build_py):
    def run(self):
        super().run()
        os.makedirs(os.path.join(self.build_lib, "wsync", "v1"), exist_ok=True)
        _stubs(self.build_lib)
        _native(self.build_lib)


class BinaryDistribution(Distribution):
    def has_ext_modules(self):  # the wheel carries wsync/_native*.so
        return True


setup(cmdclass={"build_py": BuildPy}, distclass=BinaryDistribution)
