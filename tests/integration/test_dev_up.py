"""`airlock dev up` as an operator meets it: errors on its own stderr, idle exits that are not failures (issue 16)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from support import Background, custom_stack, stop_stack, wait_pending


def dev_up(runtime: Path, config: str) -> subprocess.CompletedProcess[str]:
    path = runtime.parent / "bad.yaml"
    path.write_text(config, encoding="utf-8")
    return subprocess.run(
        [sys.executable, "-m", "airlock", "dev", "up", "--runtime-dir", str(runtime), "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_broken_policy_is_reported_with_its_place_and_dev_up_exits(tmp_path: Path) -> None:
    result = dev_up(tmp_path / "rt", "policy:\n  default: ask\n  rules:\n    - name: x\n      decision: maybe\n")
    assert result.returncode != 0
    bad = tmp_path / "bad.yaml"
    assert f"{bad}:5:" in result.stderr and "maybe" in result.stderr, result.stderr
    assert "did not start" not in result.stderr and "ready" not in result.stdout


def test_a_broken_policy_file_in_policy_d_is_reported_too(tmp_path: Path) -> None:
    runtime = tmp_path / "rt"
    (runtime / "policy.d").mkdir(parents=True)
    dropin = runtime / "policy.d" / "10-bad.yaml"
    dropin.write_text("rules:\n  - name: y\n    decision: allow\n    commands: [[/usr/bin/true]]\n    colour: blue\n")
    result = dev_up(runtime, "")
    assert result.returncode != 0
    assert f"{dropin}:" in result.stderr and "colour" in result.stderr, result.stderr


def test_a_broken_config_is_reported_with_its_place(tmp_path: Path) -> None:
    result = dev_up(tmp_path / "rt", "limits:\n  write_timeout_seconds: soon\n")
    assert result.returncode != 0
    assert f"{tmp_path / 'bad.yaml'}:2:26: limits.write_timeout_seconds:" in result.stderr, result.stderr


def test_idle_exits_are_not_failures_the_next_connection_starts_the_service(tmp_path: Path) -> None:
    config = "services:\n  idle_exit_seconds: 1\n"
    with custom_stack(tmp_path / "rt", config) as stack:
        for round_ in range(7):  # more than the 5 restarts in 30 s that count as "keeps failing"
            pid = stack.service_pid("intake")
            deadline = time.monotonic() + 60
            while stack.find_service_pid("intake") == pid:
                assert time.monotonic() < deadline, f"round {round_}: intake never exited idle"
                time.sleep(0.1)
            assert stack.proc.poll() is None, "dev up stopped"
            assert stack.native("ping")["ok"] is True  # the connection starts intake again
        assert stack.exec({"argv": ["true"], "privileged": False})["ok"] is True
    log = (tmp_path / "rt" / "logs" / "intake.log").read_text()
    assert "intake.service.stopping" in log and '"reason": "idle"' in log


def test_a_stop_is_prompt_and_every_service_journals_its_own_stop(tmp_path: Path) -> None:
    # Idle pooled connections between the services would hold a stop for the whole read
    # timeout (made long here) and a journal stopped first left the others' last records
    # waiting on a socket nobody served (issue 36's 15-21 s teardowns).
    config = "limits:\n  read_timeout_seconds: 30\n"
    with custom_stack(tmp_path / "rt", config) as stack:
        assert stack.exec({"argv": ["true"], "privileged": False})["ok"] is True
        assert stack.native("running", path=stack.operator)["ok"] is True  # approval -> runner, pooled
        waiting = Background(stack, {"argv": ["true"], "privileged": True})
        wait_pending(stack, waiting.request_id)
        started = time.monotonic()
        stop_stack(stack)
        took = time.monotonic() - started
    assert waiting.result()["error"]["code"] == "approval_interrupted"
    assert took < 4, f"dev up took {took:.1f}s to stop"
    stops = [row["writer"] for row in stack.journal_rows() if row["kind"] == "service.stopping"]
    assert sorted(stops) == ["approval", "intake", "journal", "runner"], stops


def test_a_relay_slower_than_the_idle_exits_still_starts_dev_up(tmp_path: Path) -> None:
    """Issue 44: "notify did not start" on a start.  The relay is ready only once the journal has answered it
    through approval; while dev up waited for that it did not start a service that had idled out meanwhile, so
    the relay's question sat in approval's backlog until dev up gave up.  Here the relay is held back (its
    secret file is a FIFO nobody has written yet) until the others have idled out, as a slow start would."""
    import os
    import threading

    runtime = tmp_path / "rt"
    fifo = tmp_path / "secret"
    os.mkfifo(fifo, 0o600)
    config = (
        "services:\n  idle_exit_seconds: 1\n"
        "notify:\n  channels:\n"
        f"    - {{type: webhook, name: hook, url: 'http://127.0.0.1:9/hook', secret_file: {fifo}}}\n"
    )
    path = tmp_path / "cfg.yaml"
    path.write_text(config, encoding="utf-8")
    argv = [sys.executable, "-m", "airlock", "dev", "up", "--runtime-dir", str(runtime), "--config", str(path)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        logs = runtime / "logs"
        deadline = time.monotonic() + 20
        # Every service has served and idled out (approval and the journal included) before the relay goes on.
        while not all(
            (logs / f"{name}.log").exists() and "service.stopped" in (logs / f"{name}.log").read_text()
            for name in ("approval", "journal")
        ):
            assert time.monotonic() < deadline and proc.poll() is None, "the services never idled out"
            time.sleep(0.1)
        threading.Thread(target=lambda: fifo.write_text("relay-test-secret-0123456789\n"), daemon=True).start()
        assert proc.stdout is not None
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if "ready" in line or "did not start" in line:
                break
        assert any("airlock dev: ready" in line for line in seen), "".join(seen)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
