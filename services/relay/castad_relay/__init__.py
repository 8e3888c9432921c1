"""The outbox relay: moves committed outbox rows of every service to RabbitMQ."""
