"""Errors raised by device backends; vendor exceptions (``pynvml.NVMLError``) never leak above."""

from __future__ import annotations


class DeviceError(Exception):
    """A device query failed (driver error, device lost, permission)."""


class DeviceNotSupportedError(DeviceError):
    """The device or driver does not offer this measurement (e.g. energy on pre-Volta GPUs)."""


class DeviceInitError(DeviceError):
    """The backend could not be started (no library, no driver, no devices)."""
