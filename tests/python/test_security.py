"""The Python clients against a TLS controller (docs/security.md):
wsync.Client / wsync.aio.Client with tls= and token=, a client certificate's
role, the errors of missing and insufficient credentials, and an embedded
worker registering over mutual TLS. Certificates are made with openssl."""
import asyncio
import os
import subprocess
import time

import pytest

import wsync
import wsync.aio
from wsync import errors

from harness import CONTROLLER_BIN, WSYNCCTL_BIN, Process, read_port_file

TRAINER = "py-trainer-token-0123456789"
READER = "py-reader-token-0123456789"


def openssl(cwd, *commands):
    for c in commands:
        subprocess.run(["bash", "-c", c], cwd=cwd, check=True, capture_output=True, timeout=60)


def issue(cwd, name, san):
    openssl(cwd,
            f"openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
            f"-keyout {name}.key -out {name}.csr -subj /CN={name}",
            f"printf 'subjectAltName={san}\\n' > {name}.ext",
            f"openssl x509 -req -in {name}.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
            f"-days 2 -out {name}.pem -extfile {name}.ext")


@pytest.fixture(scope="module")
def tls_controller(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("tls"))
    openssl(d, "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
               "-keyout ca.key -out ca.pem -days 2 -subj /CN=wsync-py-ca")
    issue(d, "server", "IP:127.0.0.1,DNS:localhost")
    issue(d, "reader", "URI:wsync://role/reader")
    issue(d, "worker", "URI:wsync://group/inference")
    with open(os.path.join(d, "tokens"), "w") as f:
        f.write(f"{TRAINER} trainer py-trainer\n{READER} reader py-reader\n")
    pf = os.path.join(d, "controller.ports")
    p = Process([CONTROLLER_BIN, "--listen=127.0.0.1:0", "--metrics_port=-1", f"--port_file={pf}",
                 f"--tls_cert={d}/server.pem", f"--tls_key={d}/server.key",
                 f"--tls_client_ca={d}/ca.pem", f"--tokens_file={d}/tokens"],
                os.path.join(d, "controller.log"))
    try:
        port = read_port_file(pf, "grpc_port", proc=p.proc)
        yield f"127.0.0.1:{port}", d
    finally:
        p.stop()


def test_tokens_and_roles_over_tls(tls_controller):
    address, d = tls_controller
    ca = os.path.join(d, "ca.pem")
    with wsync.Client(address, tls=ca, token=READER, timeout=10) as reader:
        assert reader.status().workers_alive == 0
        with pytest.raises(errors.PermissionDenied, match="needs role trainer"):
            reader.sync(1, transfer="t")
    with wsync.Client(address, tls=ca, timeout=10) as anonymous:
        with pytest.raises(errors.Unauthenticated, match="no credentials"):
            anonymous.status()
    with wsync.Client(address, tls=ca, token="not-a-token-we-know-of", timeout=10) as stranger:
        with pytest.raises(errors.Unauthenticated, match="not in --tokens_file"):
            stranger.status()
    cert = wsync.Tls(ca=ca, cert=os.path.join(d, "reader.pem"), key=os.path.join(d, "reader.key"))
    with wsync.Client(address, tls=cert, timeout=10) as by_certificate:
        by_certificate.status()
    with wsync.Client(address, token=TRAINER, timeout=5) as plaintext:
        with pytest.raises(errors.Unavailable):
            plaintext.status()


def test_aio_client_sends_its_token(tls_controller):
    address, d = tls_controller

    async def main():
        async with wsync.aio.Client(address, tls=os.path.join(d, "ca.pem"), token=TRAINER,
                                    timeout=10) as c:
            return (await c.status()).controller_instance
    assert asyncio.run(main())


def test_embedded_worker_registers_over_mutual_tls(tls_controller):
    from wsync import embedded
    address, d = tls_controller
    w = embedded.Worker(address, "inference:0:1", controller_ca=os.path.join(d, "ca.pem"),
                        cert=os.path.join(d, "worker.pem"), key=os.path.join(d, "worker.key"))
    try:
        with wsync.Client(address, tls=os.path.join(d, "ca.pem"), token=READER,
                          timeout=10) as c:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not c.workers("inference"):
                time.sleep(0.1)
            listed = c.workers("inference")
            assert len(listed) == 1 and listed[0].alive
            assert listed[0].lease_id == ""  # a secret, never listed
            assert listed[0].identity == "wsync://group/inference"
    finally:
        w.stop()


def test_wsyncctl_replicas_speaks_tls_with_a_token(tls_controller, tmp_path):
    address, d = tls_controller
    token = tmp_path / "token"
    token.write_text(READER + "\n")
    base = [WSYNCCTL_BIN, "replicas", f"--controller={address}", "--group=inference"]
    ok = subprocess.run(base + [f"--controller_ca={d}/ca.pem", f"--token_file={token}"],
                        capture_output=True, text=True, timeout=30)
    assert ok.returncode == 0, ok.stderr
    assert "group inference" in ok.stdout
    anonymous = subprocess.run(base + [f"--controller_ca={d}/ca.pem"], capture_output=True,
                               text=True, timeout=30)
    assert anonymous.returncode != 0
    assert "no credentials" in anonymous.stdout + anonymous.stderr


def test_tls_argument_is_checked():
    with pytest.raises(ValueError, match="go together"):
        wsync.Client("127.0.0.1:1", tls=wsync.Tls(ca=None, cert="c.pem"))
    with pytest.raises(TypeError):
        wsync.Client("127.0.0.1:1", tls=3)


def test_wsyncctl_health_over_tls(tls_controller):
    """`wsyncctl health` (the image's HEALTHCHECK, the chart's TLS probes and
    helm test) reaches grpc.health.v1 over TLS with the CA alone; dialling an
    address the certificate does not name needs --tls_server_name."""
    address, d = tls_controller
    health = [WSYNCCTL_BIN, "health", f"--controller={address}", f"--controller_ca={d}/ca.pem",
              "--timeout_ms=5000"]
    ok = subprocess.run(health, capture_output=True, text=True, timeout=30)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.strip() == "SERVING"
    # The certificate names 127.0.0.1 and localhost, not the overriding name.
    unnamed = subprocess.run(health + ["--tls_server_name=elsewhere.example"],
                             capture_output=True, text=True, timeout=30)
    assert unnamed.returncode == 1, unnamed.stdout + unnamed.stderr
    named = subprocess.run(health + ["--tls_server_name=localhost"], capture_output=True,
                           text=True, timeout=30)
    assert named.returncode == 0, named.stdout + named.stderr
    plaintext = subprocess.run([WSYNCCTL_BIN, "health", f"--controller={address}",
                                "--timeout_ms=2000"], capture_output=True, text=True, timeout=30)
    assert plaintext.returncode == 1


def test_wsyncctl_operator_commands_over_tls(tls_controller):
    """`wsyncctl status / workers / sync` over TLS with the --tls_* aliases:
    a trainer's token, a reader's client certificate; the controller's
    refusals come back with their gRPC code (docs/operations.md)."""
    address, d = tls_controller

    def ctl(*args):
        r = subprocess.run([WSYNCCTL_BIN, *args, f"--controller={address}",
                            f"--tls_ca={d}/ca.pem"], capture_output=True, text=True, timeout=30)
        return r.returncode, r.stdout + r.stderr

    code, out = ctl("status", f"--token={TRAINER}")
    assert code == 0, out
    assert "workers registered" in out
    reader_cert = [f"--tls_cert={d}/reader.pem", f"--tls_key={d}/reader.key"]
    code, out = ctl("workers", *reader_cert)
    assert code == 0, out
    assert "GROUP/RANK" in out
    code, out = ctl("sync", "nosuch", "1", "--wait", *reader_cert)
    assert code == 1, out
    assert "PERMISSION_DENIED" in out and "needs role trainer" in out
    code, out = ctl("sync", "nosuch", "1", "--wait", f"--token={TRAINER}")
    assert code == 1, out
    assert "NOT_FOUND" in out and "nosuch" in out
    code, out = ctl("cancel", "nosuch@1#1", "--insecure", f"--token={TRAINER}")
    assert code == 2, out
    assert "--insecure (plaintext) contradicts --controller_ca" in out
