"""Kafka client options from the settings: the bootstrap address plus TLS and SASL when configured.

Every Kafka client of the pipeline (aiokafka consumers and producers, the faust app) is built with
:func:`client_kwargs`, so one set of settings secures them all::

    PRIVREC_KAFKA_SECURITY_PROTOCOL=SASL_SSL PRIVREC_KAFKA_SASL_MECHANISM=SCRAM-SHA-512 \\
    PRIVREC_KAFKA_SASL_USERNAME=privrec PRIVREC_KAFKA_SASL_PASSWORD=... PRIVREC_KAFKA_SSL_CAFILE=/etc/ca.pem

The embedded Tansu broker is plaintext on loopback; these settings are for a production Kafka.

>>> from pipeline.config.settings import Settings
>>> client_kwargs(Settings(kafka="k:9092"))
{'bootstrap_servers': 'k:9092'}
>>> sorted(client_kwargs(Settings(kafka="k:9093", kafka_security_protocol="SASL_PLAINTEXT",
...                               kafka_sasl_username="u", kafka_sasl_password="p")))
['bootstrap_servers', 'sasl_mechanism', 'sasl_plain_password', 'sasl_plain_username', 'security_protocol']
"""

from __future__ import annotations

from typing import Any

from .settings import Settings

__all__ = ["client_kwargs", "faust_credentials", "PRODUCE_TIMEOUT_MS"]

#: The request timeout of the web server's feedback producer (the outbox forwarder's): a record batch the broker has
#: not acknowledged is given up at its first failed attempt this long after it was made, so a dead broker costs a
#: ``/feedback`` at most this. A replacement broker must not listen before every such batch of the dead broker's
#: time is given up (:data:`privrec.ops.repair.NEW_BROKER_AFTER_S`).
PRODUCE_TIMEOUT_MS = 5000


def client_kwargs(settings: Settings) -> dict[str, Any]:
    """Keyword arguments for ``AIOKafkaConsumer`` / ``AIOKafkaProducer``."""
    out: dict[str, Any] = {"bootstrap_servers": settings.kafka}
    protocol = settings.kafka_security_protocol
    if protocol == "PLAINTEXT":
        return out
    out["security_protocol"] = protocol
    if "SSL" in protocol:
        from aiokafka.helpers import create_ssl_context

        out["ssl_context"] = create_ssl_context(cafile=settings.kafka_ssl_cafile)
    if protocol.startswith("SASL"):
        out.update(sasl_mechanism=settings.kafka_sasl_mechanism, sasl_plain_username=settings.kafka_sasl_username,
                   sasl_plain_password=settings.kafka_sasl_password)
    return out


def faust_credentials(settings: Settings) -> Any:
    """``faust.App(broker_credentials=...)`` for the settings (``None``: plaintext)."""
    import faust

    protocol = settings.kafka_security_protocol
    if protocol == "PLAINTEXT":
        return None
    ssl_context = client_kwargs(settings).get("ssl_context")
    if protocol == "SSL":
        return faust.SSLCredentials(ssl_context)
    mechanism = {"PLAIN": "PLAIN", "SCRAM-SHA-256": "SCRAM-SHA-256", "SCRAM-SHA-512": "SCRAM-SHA-512"}
    return faust.SASLCredentials(username=settings.kafka_sasl_username, password=settings.kafka_sasl_password,
                                 ssl_context=ssl_context, mechanism=mechanism[settings.kafka_sasl_mechanism])
