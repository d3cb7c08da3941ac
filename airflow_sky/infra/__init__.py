"""Infras: the Cloud interface (base), the table of drivers (registry), the Cluster object the layers above
use (cluster), and the drivers themselves (local; ssh, aws and gcp go here too).
"""
