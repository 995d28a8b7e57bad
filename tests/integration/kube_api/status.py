"""The API's refusals: `Status` objects as kube-apiserver words them, raised while a request is
handled and sent back by the server with their code."""

from __future__ import annotations

from typing import Any


class StatusError(Exception):
    """A request refused with `status` (a `Status` object; its `code` is the HTTP code)."""

    def __init__(self, status: dict[str, Any]) -> None:
        super().__init__(status["message"])
        self.status = status


def status(
    code: int, reason: str, message: str, details: dict[str, Any] | None = None
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
    }
    if details is not None:
        body["details"] = details
    body["code"] = code
    return body


def not_found(resource: str, name: str) -> StatusError:
    return StatusError(
        status(404, "NotFound", f'{resource} "{name}" not found', {"name": name, "kind": resource})
    )


def bad_request(message: str) -> StatusError:
    return StatusError(status(400, "BadRequest", message))


def method_not_allowed() -> StatusError:
    return StatusError(
        status(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )
    )


def already_exists(resource: str, name: str, *, shown: str | None = None) -> StatusError:
    """409 for a create of a name in use; `shown` is the resource as the message names it."""
    return StatusError(
        status(
            409,
            "AlreadyExists",
            f'{shown or resource} "{name}" already exists',
            {"name": name, "kind": resource},
        )
    )


def conflict(resource: str, name: str, *, shown: str | None = None) -> StatusError:
    """409 for a write whose resourceVersion is not the stored one."""
    return StatusError(
        status(
            409,
            "Conflict",
            f'Operation cannot be fulfilled on {shown or resource} "{name}": the object has '
            "been modified; please apply your changes to the latest version and try again",
            {"name": name, "kind": resource},
        )
    )


def invalid(kind: str, name: str, errors: list[tuple[str, str]]) -> StatusError:
    """422 as field.ErrorList.ToAggregate() words it; errors are (field, message)."""
    texts = [f"{path}: {text}" for path, text in errors]
    joined = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
    causes = [
        {"reason": "FieldValueInvalid", "message": text, "field": path} for path, text in errors
    ]
    return StatusError(
        status(
            422,
            "Invalid",
            f'{kind} "{name}" is invalid: {joined}',
            {"name": name, "kind": kind, "causes": causes},
        )
    )
