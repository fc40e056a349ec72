"""The times-agent rollout's code, imported by absolute name from main.py."""
