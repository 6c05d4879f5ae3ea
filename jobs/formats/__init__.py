"""Decoders for Avro and Protobuf values (plain or Confluent-framed), used as transforms."""
