// Calls to the gateway with the session's API key. The key lives in sessionStorage only (never in a URL
// or a cookie), so it is gone when the tab closes; a 401 ends the session and sends back to the login.

import { t } from "./i18n.js";

const KEY = "castad.key";
const ACTOR = "castad.actor";
const DEFAULT_ACTOR = "console";
let whenUnauthorized = () => {};

export class ApiError extends Error {
  constructor(status, detail, fields = []) {
    super(detail);
    this.status = status;
    this.fields = fields; // a 422's: each refused field's place in the request (loc) and why (msg)
  }
}

export const session = {
  key: () => sessionStorage.getItem(KEY),
  actor: () => sessionStorage.getItem(ACTOR) || DEFAULT_ACTOR,
  start(key, actor) {
    sessionStorage.setItem(KEY, key);
    sessionStorage.setItem(ACTOR, actor || DEFAULT_ACTOR);
  },
  end() {
    sessionStorage.removeItem(KEY);
  },
};

/** What went wrong, for the operator: the gateway's reason, or that it could not be reached. Anything
 * else is a bug of the console, and is thrown on. */
export function problem(error) {
  if (error instanceof ApiError) return error.message;
  throw error;
}

/** fetch, with a network failure as an ApiError of status 0 (the gateway could not be reached). */
async function reach(resource, init) {
  try {
    return await fetch(resource, init);
  } catch (error) {
    if (error.name === "AbortError") throw error;
    throw new ApiError(0, t("error.unreachable"));
  }
}

/** What to do when the gateway answers 401 (the key was revoked, or never valid). */
export function onUnauthorized(handler) {
  whenUnauthorized = handler;
}

export function unauthorized() {
  session.end();
  whenUnauthorized();
}

export function url(path, params = {}) {
  const query = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) {
    if (value !== null && value !== undefined && value !== "") query.set(name, value);
  }
  const text = query.toString();
  return text ? `${path}?${text}` : path;
}

export function authorization() {
  return { Authorization: `Bearer ${session.key()}` };
}

/** The gateway's refusal as an ApiError: its `detail`, a validation error's fields and messages, or the status. */
async function refusal(response) {
  let body = null;
  try {
    body = await response.json();
  } catch {
    // not JSON: the status says it
  }
  if (typeof body?.detail === "string") return new ApiError(response.status, body.detail);
  if (Array.isArray(body?.detail)) {
    const fields = body.detail.map((error) => ({ loc: error.loc || [], msg: error.msg }));
    return new ApiError(response.status, fields.map((f) => `${f.loc.join(".")}: ${f.msg}`).join("; "), fields);
  }
  return new ApiError(response.status, `${response.status} ${response.statusText}`);
}

/** A request of the gateway with the session's key: `body` sent as JSON, or `file` (a File or Blob) as it is. */
async function send(path, { method = "GET", params, body, file } = {}) {
  const headers = { ...authorization(), Accept: "application/json" };
  if (method !== "GET") headers["X-Castad-Actor"] = session.actor();
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (file !== undefined) headers["Content-Type"] = file.type || "application/octet-stream";
  const response = await reach(url(path, params), {
    method,
    headers,
    body: file ?? (body === undefined ? undefined : JSON.stringify(body)),
    cache: "no-store",
  });
  if (response.status === 401) {
    unauthorized();
    throw await refusal(response);
  }
  if (!response.ok) throw await refusal(response);
  return response;
}

/** A JSON answer of the gateway (null for one without a body: 204). */
export async function call(path, options) {
  const response = await send(path, options);
  return response.status === 204 ? null : response.json();
}

/** A file of the gateway (an artifact), as a Blob: the key goes in the header, never in the URL. With an
 * object store the gateway answers 307 to a presigned URL, which fetch follows (without the key). */
export async function download(path) {
  const response = await send(path);
  return response.blob();
}

/** The key's tenant, name and scopes, or an ApiError (401 for a wrong key) without ending any session. */
export async function whoIs(key) {
  const response = await reach("/v1/me", { headers: { Authorization: `Bearer ${key}` }, cache: "no-store" });
  if (!response.ok) throw await refusal(response);
  return response.json();
}
