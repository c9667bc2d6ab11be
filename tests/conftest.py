"""Shared fixtures. `ray_session`: ONE local Ray instance for the whole test session, started on first use
(tests that do not ask for it never pay for Ray) and shut down at the end. Tests that need a cluster of their
own (ray.cluster_utils.Cluster, `ray job submit`) run it in a subprocess, so they never share this instance."""
import os

import pytest


@pytest.fixture(scope="session")
def ray_session():
    import ray

    if ray.is_initialized():       # someone else's instance: use it, leave it running
        yield ray
        return
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    if os.environ.get("RAY_ADDRESS"):
        ray.init(log_to_driver=False, logging_level="ERROR")
    else:   # a new local instance on loopback (127.0.0.1 would be replaced by the machine's outward address)
        from ldpfed.engine.ray_security import disable_metrics_export, enable_token_auth

        enable_token_auth()         # as ensure_ray does: a private (0600) token, no token warning
        disable_metrics_export()
        ray.init(address="local", _node_ip_address="127.0.0.2", num_cpus=2, include_dashboard=False,
                 log_to_driver=False, logging_level="ERROR", object_store_memory=512 * 1024**2)
    try:
        yield ray
    finally:
        from ldpfed.engine.ray_engine import IDLE_ACTORS

        IDLE_ACTORS.clear()
        ray.shutdown()


def pytest_collection_modifyitems(config, items):
    # Under pytest-xdist (pyproject's `-n auto`): every test on the shared Ray instance runs in one worker, so there is
    # one such instance, not one per worker.
    for item in items:
        if "ray_session" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("ray"))


@pytest.fixture
def interrupted_and_resumed(tmp_path):
    """resume(config, users_done) -> (the whole run, the run interrupted once `users_done` users are done and
    resumed from its checkpoint): what a resume test compares, bit for bit."""
    from ldpfed.engine import run_local
    from ldpfed.engine.checkpoint import Checkpointer

    class Interrupt(BaseException):
        pass

    def resume(config, users_done):
        def progress(done, regret):
            if done == users_done:
                raise Interrupt

        whole = run_local(config)
        with pytest.raises(Interrupt):
            run_local(config, progress=progress, checkpointer=Checkpointer(tmp_path, every_s=None))
        return whole, run_local(config, checkpointer=Checkpointer(tmp_path, every_s=None))

    return resume
