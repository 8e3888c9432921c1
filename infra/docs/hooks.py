"""MkDocs hooks: the pages written from the code, so that the site says each fact where the code says it.

The API reference is rendered from the gateway's own OpenAPI document and the command line reference from
Typer's own help. The reports the `make bench*` and `make faults` targets generate are written straight into
docs/reports/, so the site takes them as any other page.
"""

from __future__ import annotations

import pathlib
import tempfile
from typing import Any

import sqlalchemy as sa
import typer
import typer.cli
import typer.main
from castad_api import app, deps, notifications, settings
from castad_cli import main as cli_main
from castad_local import admin
from castad_runtime.artifacts import volume
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

API_PAGE = "api/reference.md"
CLI_MARKER = "<!-- cli-reference -->"


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add the API reference to the site."""
    files.append(File.generated(config, API_PAGE, content=api_reference(openapi_document())))
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    """Put each command's help, as Typer prints it, where the command line page asks for it."""
    if CLI_MARKER not in markdown:
        return markdown
    return markdown.replace(CLI_MARKER, cli_reference())


def openapi_document() -> dict[str, Any]:
    """Return the gateway's OpenAPI document, built without connecting to anything."""
    config = settings.ApiSettings()
    gateway = deps.Gateway(
        config=config,
        engine=sa.create_engine(config.database_url),  # never connected: only the document is built
        notifications=notifications.PipelineNotifications(config.database_url),
        store=volume.VolumeStore(pathlib.Path(tempfile.gettempdir())),
    )
    return app.create_app(gateway).openapi()


def cli_reference() -> str:
    """Return the help of `castad` and `castad-admin` as Markdown."""
    parts = []
    for name, typer_app in (("castad", cli_main.app), ("castad-admin", admin.app)):
        command = typer.main.get_command(typer_app)
        docs = typer.cli.get_docs_for_click(obj=command, ctx=typer.Context(command), name=name, indent=2)
        parts.append(docs.strip())
    return "\n\n".join(parts) + "\n"


def api_reference(document: dict[str, Any]) -> str:
    """Render an OpenAPI document's operations and schemas as Markdown."""
    info = document["info"]
    lines = [
        "# API reference",
        "",
        f"{info.get('summary', '')} Generated from the gateway's OpenAPI document (version {info['version']}),",
        "which a running gateway serves at `/openapi.json`; how to use it is in [Using the API](index.md).",
        "",
    ]
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            lines += _operation(method, path, operation)
    lines += ["## Schemas", ""]
    for name, schema in document["components"]["schemas"].items():
        lines += _schema(name, schema)
    return "\n".join(lines) + "\n"


def _operation(method: str, path: str, operation: dict[str, Any]) -> list[str]:
    lines = [f"## `{method.upper()} {path}`", "", f"**{operation.get('summary', '')}**", ""]
    if operation.get("description"):
        lines += [operation["description"], ""]
    if operation.get("security"):
        lines += ["Needs an API key (`Authorization: Bearer <key>`).", ""]
    parameters = operation.get("parameters", [])
    if parameters:
        lines += ["| parameter | in | type | required | description |", "|---|---|---|---|---|"]
        for parameter in parameters:
            description = parameter.get("description") or parameter.get("schema", {}).get("description", "")
            required = "yes" if parameter.get("required") else ""
            lines.append(
                f"| `{parameter['name']}` | {parameter['in']} | {_type(parameter.get('schema', {}))}"
                f" | {required} | {_cell(description)} |"
            )
        lines.append("")
    body = operation.get("requestBody")
    if body:
        types = ", ".join(f"{_type(media.get('schema', {}))} ({kind})" for kind, media in body["content"].items())
        lines += [f"Request body: {types}.", ""]
    lines += ["| status | meaning | body |", "|---|---|---|"]
    for code, response in operation.get("responses", {}).items():
        bodies = ", ".join(_type(media.get("schema", {})) for media in response.get("content", {}).values())
        lines.append(f"| {code} | {_cell(response.get('description', ''))} | {bodies} |")
    return [*lines, ""]


def _schema(name: str, schema: dict[str, Any]) -> list[str]:
    lines = [f"### {name} {{#{_anchor(name)}}}", ""]
    if schema.get("description"):
        lines += [_cell(schema["description"]), ""]
    if "enum" in schema:
        return [*lines, "One of " + ", ".join(f"`{value}`" for value in schema["enum"]) + ".", ""]
    properties = schema.get("properties", {})
    if properties:
        required = set(schema.get("required", []))
        lines += ["| field | type | required | description |", "|---|---|---|---|"]
        for field, spec in properties.items():
            flag = "yes" if field in required else ""
            lines.append(f"| `{field}` | {_type(spec)} | {flag} | {_cell(spec.get('description', ''))} |")
        lines.append("")
    return lines


def _type(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{_anchor(name)})"
    for combinator in ("anyOf", "oneOf", "allOf"):
        if combinator in schema:
            return " or ".join(_type(part) for part in schema[combinator])
    kind = schema.get("type", "any")
    if kind == "array":
        return f"array of {_type(schema.get('items', {}))}"
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return f"object of {_type(schema['additionalProperties'])}"
    if "format" in schema:
        return f"{kind} ({schema['format']})"
    return str(kind)


def _anchor(name: str) -> str:
    return "schema-" + name.lower()


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")
