"""What runs on a node, over SSH: one connection (client), shell text, detached jobs, log tails, file sync,
buckets and artifacts. It knows a node's address (node.record.Node), never its cloud.

Nothing is imported here, so that a module that only needs the Node record does not load paramiko.
"""
