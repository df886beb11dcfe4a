"""The lab connector's open shell per host
(lab/pyinfra-connector/src/inference_host_lab_connector/shell.py), run here against a local `sh`
in place of `docker exec -i <container> sh`: what pyinfra gets back must be what a
`docker exec` per command gave it (status, stdout and stderr apart, lines split as pyinfra's
read_buffer splits them, stdin empty), uploads land whole with docker cp's mode, and a shell that
dies or a command that times out never makes a command run twice or answer for another."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from inference_host_lab_connector.shell import ENDED, ShellSession, command_output


@pytest.fixture
def session():
    opened = ShellSession(["sh"])
    yield opened
    opened.close()


def test_status_and_the_two_outputs_come_back_apart(session):
    assert session.run("echo out; echo err >&2; exit 3") == (3, ["out"], ["err"])
    assert session.run("true") == (0, [], [])


def test_lines_are_split_as_pyinfra_splits_them(session):
    # pyinfra's read_buffer: one line per "\n", the "\n" dropped, a "\r" kept, no empty last line.
    assert session.run(r"printf 'a\r\nb\n\nc'") == (0, ["a\r", "b", "", "c"], [])


def test_what_a_command_prints_cannot_end_its_own_output(session):
    status, out, _ = session.run("printf '%s\\n' 0 1 END_0 deadbeef 'ZWNobw==' ; exit 0")
    assert (status, out) == (0, ["0", "1", "END_0", "deadbeef", "ZWNobw=="])


def test_stdin_is_empty_as_pyinfras_closed_pipe(session):
    assert session.run("cat; echo done") == (0, ["done"], [])


def test_commands_do_not_share_state(session):
    session.run("cd /tmp; x=1; export Y=2; umask 077")
    assert session.run('pwd; echo "${x:-unset} ${Y:-unset}"; umask') == (0, [os.getcwd(), "unset unset", "0022"], [])


def test_an_upload_lands_whole_with_docker_cps_mode(session, tmp_path):
    target = tmp_path / "file.bin"
    target.write_text("old")
    target.chmod(0o644)
    data = os.urandom(300_000)  # more than one argument may hold (128 KiB)
    assert session.put(data, str(target)) == (0, [], [])
    assert target.read_bytes() == data
    assert oct(target.stat().st_mode & 0o777) == "0o600"
    assert session.put(b"", str(tmp_path / "empty"))[0] == 0 and (tmp_path / "empty").read_bytes() == b""
    assert [p.name for p in tmp_path.iterdir() if ".lab-put." in p.name] == []


def test_an_upload_to_a_missing_folder_fails_and_leaves_nothing(session, tmp_path):
    status, _, err = session.put(b"x", str(tmp_path / "missing" / "file"))
    assert status != 0 and err and "missing" in err[0]


def test_a_shell_that_dies_answers_the_command_failed_and_never_runs_it_twice(session, tmp_path):
    count = tmp_path / "count"
    status, out, err = session.run(f"echo run >> {count}; kill -9 $PPID")
    assert status == ENDED and out == [] and "session ended" in err[0]
    assert count.read_text() == "run\n"
    assert session.run("echo back") == (0, ["back"], [])
    assert count.read_text() == "run\n"


def test_a_timed_out_command_raises_and_the_next_one_gets_its_own_answer(tmp_path):
    # gevent's timeout needs pyinfra's monkey-patching (its CLI does it): in a child process.
    src = Path(__file__).resolve().parents[2] / "lab" / "pyinfra-connector" / "src"
    program = textwrap.dedent(f"""
        from gevent import monkey; monkey.patch_all()
        import sys; sys.path.insert(0, {str(src)!r})
        from inference_host_lab_connector.shell import ShellSession
        s = ShellSession(["sh"])
        try:
            s.run("sleep 5; echo late", timeout=1)
            print("no timeout")
        except TimeoutError:
            print("timed out")
        print(s.run("echo next"))
    """)
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert done.stdout.splitlines() == ["timed out", "(0, ['next'], [])"], done.stderr


def test_command_output_is_pyinfras():
    output = command_output(["a"], ["b"])
    assert (output.stdout, output.stderr, output.output_lines) == ("a", "b", ["a", "b"])
