"""Transports written outside ``harel_ref``, the way a third party would, to certify."""
