"""Launchers: XManager experiments of a config's sweep (launch_xm.py; docs/launch.md)."""
