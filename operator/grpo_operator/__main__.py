"""`grpo-operator` and `python -m grpo_operator`: the operator's process."""

import sys


def run() -> None:
    # Kopf logs in through the official Kubernetes client when it can import it, and
    # imports it to find out (kopf/_core/intents/piggybacking.py, has_client, run at
    # `import kopf`): about 26 MiB of the operator's RSS for a client it does not use
    # (kube_api.py is ours; our login handler gives Kopf the credentials). The operator's
    # process makes it unimportable before Kopf is imported; the testbed and the tests,
    # which use that client, import the operator's modules without this.
    sys.modules.setdefault("kubernetes", None)  # type: ignore[arg-type]
    from .main import main

    main()


if __name__ == "__main__":
    run()
