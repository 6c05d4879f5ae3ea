"""The JVM side: the jars fetched by Maven from jvm/pom.xml, and the launcher of the JVM
services this project starts (broker, Spark Connect, standalone cluster, S3 server).
"""
