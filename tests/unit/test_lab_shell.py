"""The lab connector's open shell per host
(lab/pyinfra-connector/src/inference_host_lab_connector/shell.py), run here against a local `sh`
in place of `docker exec -i <container> sh`: what pyinfra gets back must be what a
`docker exec` per command gave it (status, stdout and stderr apart, lines split as pyinfra's
read_buffer splits them, stdin empty), uploads land whole with docker cp's mode, and a shell that
dies, a command that times out, a background child, a removed folder or a stray write into the
shell's output never makes a command run twice or answer for another."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import textwrap
import time
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
    session.run("true")
    folder = session.folder
    status, out, err = session.run(f"echo run >> {count}; kill -9 $PPID")
    assert status == ENDED and out == [] and "session ended" in err[0]
    assert count.read_text() == "run\n"
    assert not os.path.exists(folder)  # removed by a shell of its own after the first one died
    assert session.run("echo back") == (0, ["back"], [])
    assert count.read_text() == "run\n"


def test_each_commands_output_files_are_removed_after_reading(session, tmp_path):
    session.run("echo a; echo b >&2")
    session.put(b"x", str(tmp_path / "file"))
    # This command's own two files are there while it runs, and only those.
    status, out, _ = session.run(f"ls -A {session.folder}")
    assert status == 0 and len(out) == 2 and {name.rsplit(".", 1)[1] for name in out} == {"out", "err"}
    assert os.listdir(session.folder) == []


def test_a_background_child_cannot_reach_the_next_command(session):
    # Its stdout and stderr are the first command's files, read and removed when it ended.
    assert session.run("(sleep 0.5; echo late; echo late >&2) & echo now") == (0, ["now"], [])
    assert session.run("sleep 1; echo next") == (0, ["next"], [])
    assert session.run("echo again") == (0, ["again"], [])


def test_a_command_that_removes_the_folder_is_answered_failed_and_never_run_again(session, tmp_path):
    count = tmp_path / "count"
    session.run("true")
    first = session.folder
    status, out, err = session.run(f"echo run >> {count}; rm -rf {first}; echo out")
    assert status == ENDED and out == [] and "removed while it ran" in err[0]
    assert session.run("echo back") == (0, ["back"], [])
    assert count.read_text() == "run\n" and session.folder != first


def test_a_folder_gone_before_a_command_runs_it_once_in_a_new_session(session, tmp_path):
    count = tmp_path / "count"
    session.run("true")
    first = session.folder
    shutil.rmtree(first)  # what a deploy that empties /tmp would do between two commands
    assert session.run(f"echo run >> {count}; echo here") == (0, ["here"], [])
    assert count.read_text() == "run\n" and session.folder != first


@pytest.fixture
def stray_base64(tmp_path):
    """A `base64` that, the first time it runs, writes one stray line into the shell's own output
    (its stdout is the shell's): right after the output it encodes (mid-frame, between that output
    and its token) or, from a background child, a moment later (between two frames)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "base64"

    def plant(stray: str, later: bool = False) -> ShellSession:
        write = f"printf '%s\\n' {shlex.quote(stray)}"
        fake.write_text(
            f'#!/bin/sh\n{shutil.which("base64")} "$@"\n'
            f"[ -e {tmp_path}/planted ] && exit 0\n: > {tmp_path}/planted\n"
            + (f"(sleep 0.3; {write}) &\n" if later else f"{write}\n")
        )
        fake.chmod(0o755)
        return ShellSession(["env", f"PATH={bin_dir}:{os.environ['PATH']}", "sh"])

    return plant


@pytest.mark.parametrize("stray", ["late", "not base64!", "QUJD"])
def test_a_stray_write_mid_frame_ends_the_session_and_the_command_is_not_run_again(stray_base64, stray, tmp_path):
    # "late" and "QUJD" are valid base64 (4 characters): only the size in the frame's head
    # catches them; "not base64!" once escaped as a binascii.Error.
    session = stray_base64(stray)
    count = tmp_path / "count"
    try:
        status, out, err = session.run(f"echo run >> {count}; echo hello")
        assert status == ENDED and out == [] and "broken frame" in err[0]
        assert session.run("echo back") == (0, ["back"], [])
        assert count.read_text() == "run\n"
    finally:
        session.close()


def test_a_stray_write_between_frames_ends_the_session_at_the_next_command(stray_base64, tmp_path):
    session = stray_base64("late", later=True)
    count = tmp_path / "count"
    try:
        assert session.run("echo one") == (0, ["one"], [])
        time.sleep(0.6)
        status, out, err = session.run(f"echo run >> {count}; echo two")
        assert status == ENDED and out == [] and "broken frame" in err[0]
        assert session.run("echo back") == (0, ["back"], [])
        # Killed as the stray line was read: the command ran once or not at all, never twice.
        assert not count.exists() or count.read_text() == "run\n"
    finally:
        session.close()


def test_a_timed_out_command_raises_and_the_next_one_gets_its_own_answer(tmp_path):
    # gevent's timeout needs pyinfra's monkey-patching (its CLI does it): in a child process.
    src = Path(__file__).resolve().parents[2] / "lab" / "pyinfra-connector" / "src"
    program = textwrap.dedent(f"""
        from gevent import monkey; monkey.patch_all()
        import sys; sys.path.insert(0, {str(src)!r})
        from inference_host_lab_connector.shell import ShellSession
        import os
        s = ShellSession(["sh"])
        s.run("true")
        killed = s.folder
        try:
            s.run("sleep 5; echo late", timeout=1)
            print("no timeout")
        except TimeoutError:
            print("timed out")
        print("folder left" if os.path.exists(killed) else "folder removed")
        print(s.run("echo next"))
        s.close()
    """)
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert done.stdout.splitlines() == ["timed out", "folder removed", "(0, ['next'], [])"], done.stderr


def test_command_output_is_pyinfras():
    output = command_output(["a"], ["b"])
    assert (output.stdout, output.stderr, output.output_lines) == ("a", "b", ["a", "b"])


@pytest.fixture
def late_writing_wc(tmp_path):
    """A `wc` that, once it has counted the command's stdout file, appends a line to it: the late
    write of a background child landing exactly between the frame's size and its encoding."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "wc"
    fake.write_text(
        f'#!/bin/sh\n{shutil.which("wc")} "$@"\n'
        'file=$(readlink /proc/$$/fd/0)\ncase "$file" in *.out) echo late >> "$file" ;; esac\n'
    )
    fake.chmod(0o755)
    opened = ShellSession(["env", f"PATH={bin_dir}:{os.environ['PATH']}", "sh"])
    yield opened
    opened.close()


def test_a_write_between_the_size_and_the_encoding_is_not_a_broken_frame(late_writing_wc):
    assert late_writing_wc.run("echo now") == (0, ["now"], [])
    assert late_writing_wc.run("echo next; echo e >&2") == (0, ["next"], ["e"])


def test_six_hundred_late_children_leave_every_frame_whole(session):
    """The race as it happened: a child writing a moment after its command ended, at delays that
    straddle the frame's own time (in 600 such runs 270 frames broke before the sizes were kept)."""
    answers = [session.run(f"(sleep 0.00{index % 10}; echo late) & echo now") for index in range(600)]
    # A child that wrote before the frame took its size is part of the output, as it would be
    # through `docker exec` (whose stream stays open while the child holds it); after, it is not.
    broken = [a for a in answers if (a[0], sorted(a[1]), a[2]) not in ((0, ["now"], []), (0, ["late", "now"], []))]
    assert not broken, f"{len(broken)} of 600 frames broke: {broken[:3]}"
