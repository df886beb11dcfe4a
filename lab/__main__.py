"""`python -m lab [up|down|status]`: manage the rehearsal containers by hand."""

import sys

from lab import HOSTS, container_name, container_state, down, up
from roles.site.command_line import OneLineParser, run_command


def main(argv: list[str], prog: str = "python -m lab") -> int:
    parser = OneLineParser(prog=prog, description="The lab's containers (docs/lab.md).")
    parser.add_argument(
        "command",
        nargs="?",
        default="status",
        choices=("up", "down", "status"),
        help="up: bring the lab up; down: remove everything the labs made (the main lab's containers, the"
        " replica labs' and the node's models volume); status (default): each container's state",
    )
    command = parser.parse_args(argv).command
    if command == "up":
        print("\n".join(up()))
    elif command == "down":  # every lab of this prefix: the main one and the replica labs (HOSTS)
        down(tuple(HOSTS))
    else:
        for role in HOSTS:
            state = container_state(container_name(role))
            print(container_name(role), "absent" if state is None else state["State"]["Status"])
    return 0


if __name__ == "__main__":
    run_command(lambda: main(sys.argv[1:]), "python -m lab")
