"""`python -m lab [up|down|status]`: manage the rehearsal containers by hand."""

import sys

from lab import HOSTS, container_name, container_state, down, up


def main(argv: list[str]) -> int:
    command = argv[0] if argv else "status"
    if command == "up":
        print("\n".join(up()))
    elif command == "down":
        down()
    elif command == "status":
        for role in HOSTS:
            state = container_state(container_name(role))
            print(container_name(role), "absent" if state is None else state["State"]["Status"])
    else:
        print("usage: python -m lab [up|down|status]", file=sys.stderr)
        return 64
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
