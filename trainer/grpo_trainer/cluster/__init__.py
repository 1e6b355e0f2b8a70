"""Where ranks run: the devices, Ray placement groups, a rank's environment and
collective settings, NCCL's logs, and joining the Ray cluster."""
