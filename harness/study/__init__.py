"""Studies that measure the gate's error rates by simulation (argparse mains, files written); :mod:`harness.judge`
stays pure."""
