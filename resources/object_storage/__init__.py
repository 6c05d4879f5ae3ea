"""Object storage: locations (local or s3://), boto3 access, and the embedded S3-compatible
server started on loopback by the demo, the benchmark and the tests.
"""
