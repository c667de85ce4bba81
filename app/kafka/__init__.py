"""Kafka plumbing: aiokafka clients from Settings, the embedded Tansu broker, its transport."""
