"""`python -m lab [up|down|status]`: manage the rehearsal containers by hand."""

import argparse
import sys

from lab import HOSTS, container_name, container_state, down, up


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab", description="Manage the rehearsal containers by hand.")
    parser.add_argument(
        "command",
        nargs="?",
        default="status",
        choices=("up", "down", "status"),
        help="up: start them; down: remove them; status (the default): each container's state",
    )
    command = parser.parse_args(argv).command
    if command == "up":
        print("\n".join(up()))
    elif command == "down":
        down()
    else:
        for role in HOSTS:
            state = container_state(container_name(role))
            print(container_name(role), "absent" if state is None else state["State"]["Status"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
