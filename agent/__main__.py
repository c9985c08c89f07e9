"""``python -m agent serve | supervisor NODE_DIR | judge RUN_ROOT | host JOB | version``."""

import sys


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        sys.stdout.write("usage: python -m agent serve | supervisor NODE_DIR | judge RUN_ROOT | "
                         "host JOB | version\n")
        return 0 if argv else 2
    cmd = argv[0]
    if sys.version_info < (3, 8):
        sys.stderr.write("rankdeck agent needs Python >= 3.8, this is %d.%d\n"
                         % sys.version_info[:2])
        return 4
    if cmd == "serve":
        from .serve.server import main as serve_main

        return serve_main()
    if cmd == "supervisor" and len(argv) == 2:
        from .supervisor.supervisor import main as supervisor_main

        return supervisor_main(argv[1])
    if cmd == "judge" and len(argv) == 2:
        from .judge.judge import main as judge_main

        return judge_main(argv[1])
    if cmd == "host" and len(argv) == 2:  # a Slurm job's rankdeck-host step (docs/SLURM.md)
        from .slurm.host_step import main as host_main

        return host_main(argv[1])
    if cmd == "version":
        from .wire.version import agent_version

        sys.stdout.write(agent_version() + "\n")
        return 0
    sys.stderr.write("unknown command: %s\n" % " ".join(argv))
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
