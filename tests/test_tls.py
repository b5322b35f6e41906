"""TLS: a `dask scheduler`/`dask worker` cluster started with docs/cli.md's `--tls-*`
commands runs plans exactly and serves the tra_dask dashboard routes; the embedded
cluster with ``security=True``; the `tra-dask` command's TLS options."""

import json
import subprocess
import sys
import textwrap
import urllib.request
from types import SimpleNamespace

import numpy as np
import pytest
from distributed import Client, Security

import tra_dask as td
from tra_dask import cli
from tra_dask.programs import matmul, random_uniform
from tra_dask.runtime import cluster as runtime_cluster

from test_real_cluster import documented_cluster, listening

pytestmark = pytest.mark.cluster

pytest.importorskip("cryptography")  # the test extra has it; Security.temporary() needs it

TLS_LINES = "The same with TLS"


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    """``ca.pem``, ``cert.pem``, ``key.pem`` (a self-signed pair serving every role) in a folder."""
    folder = tmp_path_factory.mktemp("tls")
    temporary = Security.temporary()
    (folder / "ca.pem").write_text(temporary.tls_ca_file)
    (folder / "cert.pem").write_text(temporary.tls_scheduler_cert)
    (folder / "key.pem").write_text(temporary.tls_scheduler_key)
    return folder


def client_security(folder) -> Security:
    return Security(tls_ca_file=str(folder / "ca.pem"), tls_client_cert=str(folder / "cert.pem"),
                    tls_client_key=str(folder / "key.pem"), require_encryption=True)


@pytest.fixture(scope="module")
def tls_cluster(certs):
    with documented_cluster(TLS_LINES, certs, client_security(certs)) as (address, dashboard, procs, runs):
        yield SimpleNamespace(address=address, dashboard=dashboard, procs=procs, runs=runs)


def _get(url: str) -> str:
    return urllib.request.urlopen(url, timeout=10).read().decode()


def test_a_tls_cluster_runs_plans_exactly_and_serves_the_dashboard(tls_cluster, certs):
    assert tls_cluster.address.startswith("tls://127.0.0.1:")
    addrs = listening(tls_cluster.procs)
    assert addrs and {ip for ip, _ in addrs} == {"127.0.0.1"}, addrs
    with Client(tls_cluster.address, security=client_security(certs), timeout="30s", set_as_default=False) as client:
        workers = sorted(td.runtime.workers_info(client))
        assert len(workers) == 2 and all(w.startswith("tls://127.0.0.1:") for w in workers)
        X = random_uniform((300, 200), (100, 100), seed=3, name="X")
        Y = random_uniform((200, 150), (100, 75), seed=4, name="Y")
        rf = td.submit(matmul(X, Y), client=client)
        np.testing.assert_allclose(rf.to_numpy(), td.to_numpy(X) @ td.to_numpy(Y), rtol=1e-10, atol=1e-10)
        assert rf.transfers() == rf.plan.cost.bytes_moved
        a = np.random.default_rng(5).random((64, 48))
        got = td.compute(td.einsum("ij,kj->ik", a, a, chunks=32), client=client, calibrate=False)
        np.testing.assert_allclose(got, a @ a.T, rtol=1e-12)
        # the tra_dask routes, served by the secured scheduler's HTTP server
        link = rf.dashboard_link
        assert link.startswith(tls_cluster.dashboard + "/tra-dask#"), link
        page = _get(link.split("#")[0])
        assert rf.token in page and "LocalJoin" in page
        plans = json.loads(_get(tls_cluster.dashboard + "/tra-dask/api/plans"))
        mine = next(p for p in plans if p["token"] == rf.token)
        assert mine["done"] == mine["total"] > 0 and mine["predicted_bytes"] == rf.plan.cost.bytes_moved


def test_a_tls_cluster_is_calibrated_with_no_kept_spec(tls_cluster, certs, calibrating, monkeypatch):
    """The first plan on a TLS cluster, with no kept spec (``calibrating``) and none
    cached for this scheduler by the tests above (they planned on the suite's kept
    spec), measures it through the TLS client — not the default client."""
    from tra_dask.runtime import calibrate as calibration

    monkeypatch.setattr(calibration, "_CACHE", {})
    monkeypatch.setattr(calibration, "_KEY_OF", {})
    rng = np.random.default_rng(39)
    a, b = rng.integers(-9, 10, (64, 48)).astype(float), rng.integers(-9, 10, (48, 40)).astype(float)
    with Client(tls_cluster.address, security=client_security(certs), timeout="30s", set_as_default=False) as client:
        got = td.submit(td.einsum("ij,jk->ik", td.asarray(a), td.asarray(b)), client=client).to_numpy()
        np.testing.assert_array_equal(got, a @ b)
        spec = td.cluster_spec(client)
        assert spec.source.startswith(f"calibrated on {tls_cluster.address}"), spec.source
        assert spec.sites == 2


def test_the_command_runs_on_a_tls_cluster_as_the_readme_says(tls_cluster, certs):
    (run,) = tls_cluster.runs
    out = subprocess.run(run, cwd=certs, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr
    assert f"cluster: scheduler {tls_cluster.address}, 2 workers, 2 sites" in out.stdout and "-> OK" in out.stdout
    # without the certificates: one line, at once, before any connection
    bare = run[:run.index("--tls-ca-file")]
    out = subprocess.run([*bare, "--scale", "0.002"], cwd=certs, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and len(out.stderr.splitlines()) == 1, out.stderr
    assert f"--scheduler {tls_cluster.address} is TLS: give --tls-ca-file, --tls-cert and --tls-key" in out.stderr


@pytest.mark.parametrize("argv, message", [
    (["--tls-cert", "cert.pem"], "are for a tls:// --scheduler"),
    (["--scheduler", "tls://127.0.0.1:1", "--tls-ca-file", "missing.pem"], "--tls-ca-file missing.pem: no such file"),
    (["--scheduler", "tcp://127.0.0.1:1", "--tls-ca-file", "ca.pem", "--tls-cert", "cert.pem", "--tls-key", "key.pem"],
     "--tls-* options need a tls:// --scheduler address"),
])
def test_the_commands_tls_options_fail_clearly(certs, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(certs)
    try:
        status = cli.main(["run", "matmul", "--scale", "0.002", "--blocks", "2", "--no-progress", *argv])
    except SystemExit as e:  # argparse's own error: usage and the message
        status = e.code
    err = capsys.readouterr().err
    assert status == 2 and message in err and "Traceback" not in err, err


def test_embedded_tls_is_chosen_at_the_start(monkeypatch):
    """Asking for TLS of an embedded cluster that runs without it is an error, not a restart."""
    monkeypatch.setitem(runtime_cluster._EMBEDDED, "client", SimpleNamespace(status="running"))
    monkeypatch.setitem(runtime_cluster._EMBEDDED, "security", None)
    with pytest.raises(ValueError, match="already running without TLS; its security is chosen when it starts"):
        runtime_cluster.embedded_client(security=True)
    with pytest.raises(TypeError, match="security must be True, False, None or a distributed.Security"):
        runtime_cluster.embedded_client(security="yes")


EMBEDDED_TLS = textwrap.dedent("""
    import json, urllib.request
    import numpy as np, psutil
    from distributed import Security
    import tra_dask as td
    from tra_dask.programs import matmul
    from tra_dask.runtime import embedded_client, workers_info

    if __name__ == "__main__":
        client = embedded_client(2, security=True)
        assert client.scheduler.address.startswith("tls://127.0.0.1:"), client.scheduler.address
        x = np.random.default_rng(0).random((64, 64))
        X = td.from_numpy(x, (32, 32), name="X")
        rf = td.submit(matmul(X, X), sites=2)  # no client: the embedded TLS cluster
        assert rf.client is client
        np.testing.assert_allclose(rf.to_numpy(), x @ x, rtol=1e-12)
        three = td.compute(matmul(X, X), sites=3, progress=False)  # one more worker, with TLS too
        np.testing.assert_allclose(td.to_numpy(matmul(X, X), three), x @ x, rtol=1e-12)
        workers = sorted(workers_info(client))
        assert len(workers) == 3 and all(w.startswith("tls://127.0.0.1:") for w in workers), workers
        base = rf.dashboard_link.split("/tra-dask")[0]
        assert base.startswith("http://127.0.0.1:") and rf.token in urllib.request.urlopen(
            rf.dashboard_link.split("#")[0], timeout=10).read().decode()
        plans = json.loads(urllib.request.urlopen(base + "/tra-dask/api/plans", timeout=10).read())
        assert rf.token in [p["token"] for p in plans]
        me = psutil.Process()
        ips = {c.laddr.ip for p in [me] + me.children(recursive=True)
               for c in p.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN}
        assert ips == {"127.0.0.1"}, ips
        assert embedded_client(security=True) is client
        try:
            embedded_client(security=Security.temporary())
        except ValueError as e:
            assert "already running with TLS (another Security)" in str(e), e
        else:
            raise AssertionError("another Security was accepted")
        np.testing.assert_allclose(rf.to_numpy(), x @ x, rtol=1e-12)  # still usable
        print("TLS OK")
""")


def test_the_embedded_cluster_with_tls(tmp_path):
    script = tmp_path / "embedded_tls.py"
    script.write_text(EMBEDDED_TLS)
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert p.returncode == 0 and "TLS OK" in p.stdout, p.stderr[-3000:]
