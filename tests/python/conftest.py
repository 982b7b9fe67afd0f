import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import Cluster  # noqa: E402


@pytest.fixture
def cluster():
    c = Cluster()
    yield c
    c.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    out = yield
    rep = out.get_result()
    c = item.funcargs.get("cluster") if hasattr(item, "funcargs") else None
    if rep.failed and c is not None:
        rep.sections.append(("wsync process logs", c.logs()))
