#!/usr/bin/env node
// Test-only OpenID Connect provider for Tessera's integration tests.
//
// Usage: node provider.mjs [--port N] [--config FILE] [--ignore-stdin] [--host ADDR] [--issuer URL]
//   --host: address to listen on (default 127.0.0.1); --issuer: the issuer URL when it is not
//   http://127.0.0.1:<port> (e.g. behind a published container port).
//
// Listens on 127.0.0.1:N (default 0 = ephemeral); the issuer is
// http://127.0.0.1:<actual port>. When ready it prints exactly one JSON line to
// stdout: {"issuer":"http://127.0.0.1:PORT","port":PORT}. Everything else goes
// to stderr. It exits when stdin reaches EOF (so it never outlives the test
// process that holds the other end of the pipe), unless --ignore-stdin is
// given, and on SIGTERM / SIGINT.
//
// Besides the regular OIDC endpoints, the same port serves:
//   GET  /interaction/:uid        login form (prompt=login) or auto-consent (prompt=consent)
//   POST /interaction/:uid/login  urlencoded `login=<account id>`
//   POST /__test/rotate           new signing key first, old one kept; returns {"kid": "..."}
// The keys file holds the current private JWKs, newest first, each with `private_pem` and `public_pem` added.
//   GET  /__test/stats            {"jwks_requests", "discovery_requests", "token_requests"}
//
// Clients: `tessera` / `tessera-secret` (authorization_code + refresh_token,
// client_secret_basic or client_secret_post, redirect URIs from the config) and
// `ci` / `ci-secret` (client_credentials only).
//
// Access tokens for the API: resource indicator `tessera-api` (alias of
// `urn:tessera-api`, because oidc-provider only accepts absolute URIs) yields an
// RS256 JWT (typ at+jwt) with aud `tessera-api`, `groups`, `client_id`, and
// `sub` = account id (code flow) or client id (client credentials).
//
// The Rust harness must give this process a stdin pipe and keep it open
// (Stdio::piped()); with stdin at /dev/null it exits right after starting.

import * as crypto from 'node:crypto';
import * as fs from 'node:fs';
import * as http from 'node:http';
import * as path from 'node:path';

// oidc-provider prints its NOTICEs with console.info (stdout). stdout is reserved
// for the single "ready" line, so route every console output to stderr before the
// library is loaded (hence the dynamic import below).
for (const method of ['log', 'info', 'debug']) {
  // eslint-disable-next-line no-console
  console[method] = (...args) => console.error(...args);
}

const { default: Provider, errors: oidcErrors } = await import('oidc-provider');

// ---------------------------------------------------------------------------
// command line / configuration

function usage(message) {
  if (message) process.stderr.write(`provider.mjs: ${message}\n`);
  process.stderr.write('usage: node provider.mjs [--port N] [--config FILE] [--ignore-stdin] [--host ADDR] [--issuer URL]\n');
  process.exit(2);
}

function parseArgs(argv) {
  const out = { port: 0, config: undefined, ignoreStdin: false, host: '127.0.0.1', issuer: undefined };
  for (let i = 0; i < argv.length; i += 1) {
    const arg = argv[i];
    let name = arg;
    let value;
    const eq = arg.indexOf('=');
    if (arg.startsWith('--') && eq !== -1) {
      name = arg.slice(0, eq);
      value = arg.slice(eq + 1);
    }
    const takeValue = () => {
      if (value !== undefined) return value;
      i += 1;
      if (i >= argv.length) usage(`${name} needs a value`);
      return argv[i];
    };
    switch (name) {
      case '--port': {
        const raw = takeValue();
        const port = Number(raw);
        if (!Number.isInteger(port) || port < 0 || port > 65535) usage(`invalid port ${raw}`);
        out.port = port;
        break;
      }
      case '--config':
        out.config = takeValue();
        break;
      case '--host':
        out.host = takeValue();
        break;
      case '--issuer':
        out.issuer = takeValue();
        break;
      case '--ignore-stdin':
        out.ignoreStdin = true;
        break;
      case '-h':
      case '--help':
        usage();
        break;
      default:
        usage(`unknown argument ${arg}`);
    }
  }
  return out;
}

const args = parseArgs(process.argv.slice(2));

const fileConfig = args.config ? JSON.parse(fs.readFileSync(args.config, 'utf8')) : {};
const config = {
  redirect_uris: fileConfig.redirect_uris ?? [],
  post_logout_redirect_uris: fileConfig.post_logout_redirect_uris ?? [],
  accounts: fileConfig.accounts ?? {},
  ci_groups: fileConfig.ci_groups ?? [],
  keys_file: fileConfig.keys_file,
};

const log = (...parts) => process.stderr.write(`[oidc-test-provider] ${parts.join(' ')}\n`);

// ---------------------------------------------------------------------------
// constants

// The API's audience. oidc-provider insists (RFC 8707) that a resource
// indicator be an absolute URI, so the resource server is registered as
// API_RESOURCE_URI and the front handler rewrites `resource=tessera-api` (query
// of /auth, urlencoded body of /auth, /token and /request) to it. Both spellings
// work; the JWT's `aud` is always `tessera-api`.
const API_AUDIENCE = 'tessera-api';
const API_RESOURCE_URI = 'urn:tessera-api';
const API_SCOPE = 'api';
const TOKEN_TTL = 600;

const ROUTES = {
  authorization: '/auth',
  token: '/token',
  jwks: '/jwks',
  userinfo: '/me',
  end_session: '/session/end',
  introspection: '/token/introspection',
  revocation: '/token/revocation',
  pushed_authorization_request: '/request',
};
const DISCOVERY_PATH = '/.well-known/openid-configuration';

// ---------------------------------------------------------------------------
// accounts

function accountRecord(accountId) {
  // An unknown login name is an account with no groups (and no email/name).
  return config.accounts[accountId] ?? {};
}

async function findAccount(_ctx, id) {
  if (typeof id !== 'string' || id === '') return undefined;
  const record = accountRecord(id);
  return {
    accountId: id,
    async claims(_use, _scope, _claims, _rejected) {
      const claims = {
        sub: id,
        preferred_username: id,
        groups: Array.isArray(record.groups) ? record.groups : [],
      };
      if (record.name !== undefined) claims.name = record.name;
      if (record.email !== undefined) {
        claims.email = record.email;
        claims.email_verified = true;
      }
      return claims;
    },
  };
}

// ---------------------------------------------------------------------------
// signing keys

function newSigningKey() {
  const { privateKey } = crypto.generateKeyPairSync('rsa', { modulusLength: 2048 });
  const jwk = privateKey.export({ format: 'jwk' });
  return {
    ...jwk,
    kid: crypto.randomBytes(6).toString('hex'),
    alg: 'RS256',
    use: 'sig',
  };
}

let keys = [newSigningKey()];

function writeKeysFile() {
  if (!config.keys_file) return;
  const tmp = `${config.keys_file}.${process.pid}.tmp`;
  fs.mkdirSync(path.dirname(config.keys_file), { recursive: true });
  // Each key also as PEM (private PKCS#8 and public SPKI), which is what Rust's jsonwebtoken reads.
  const withPem = keys.map((jwk) => {
    const key = crypto.createPrivateKey({ key: jwk, format: 'jwk' });
    return {
      ...jwk,
      private_pem: key.export({ type: 'pkcs8', format: 'pem' }),
      public_pem: crypto.createPublicKey(key).export({ type: 'spki', format: 'pem' }),
    };
  });
  fs.writeFileSync(tmp, `${JSON.stringify(withPem, null, 2)}\n`, { mode: 0o600 });
  fs.renameSync(tmp, config.keys_file); // atomic replace: readers never see a partial file
}

// ---------------------------------------------------------------------------
// storage shared by every Provider instance, so that sessions, grants, codes,
// refresh tokens and pending interactions survive a key rotation

const store = new Map(); // key -> { value, expiresAt (ms since epoch) | undefined }
const GRANTABLE = new Set([
  'AccessToken',
  'AuthorizationCode',
  'RefreshToken',
  'DeviceCode',
  'BackchannelAuthenticationRequest',
]);

function storeGet(key) {
  const entry = store.get(key);
  if (!entry) return undefined;
  if (entry.expiresAt !== undefined && entry.expiresAt <= Date.now()) {
    store.delete(key);
    return undefined;
  }
  return entry.value;
}

function storeSet(key, value, expiresIn) {
  const expiresAt = typeof expiresIn === 'number' && expiresIn > 0 ? Date.now() + expiresIn * 1000 : undefined;
  store.set(key, { value, expiresAt });
}

setInterval(() => {
  const now = Date.now();
  for (const [key, entry] of store) {
    if (entry.expiresAt !== undefined && entry.expiresAt <= now) store.delete(key);
  }
}, 60_000).unref();

class SharedMemoryAdapter {
  constructor(model) {
    this.model = model;
  }

  key(id) {
    return `${this.model}:${id}`;
  }

  async upsert(id, payload, expiresIn) {
    const key = this.key(id);
    if (this.model === 'Session' && payload.uid) {
      storeSet(`sessionUid:${payload.uid}`, id, expiresIn);
    }
    if (GRANTABLE.has(this.model) && payload.grantId) {
      const grantKey = `grant:${payload.grantId}`;
      const members = storeGet(grantKey) ?? new Set();
      members.add(key);
      storeSet(grantKey, members);
    }
    if (payload.userCode) {
      storeSet(`userCode:${payload.userCode}`, id, expiresIn);
    }
    storeSet(key, payload, expiresIn);
  }

  async find(id) {
    return storeGet(this.key(id));
  }

  async findByUid(uid) {
    const id = storeGet(`sessionUid:${uid}`);
    return id === undefined ? undefined : this.find(id);
  }

  async findByUserCode(userCode) {
    const id = storeGet(`userCode:${userCode}`);
    return id === undefined ? undefined : this.find(id);
  }

  async consume(id) {
    const payload = storeGet(this.key(id));
    if (payload) payload.consumed = Math.floor(Date.now() / 1000);
  }

  async destroy(id) {
    store.delete(this.key(id));
  }

  async revokeByGrantId(grantId) {
    const grantKey = `grant:${grantId}`;
    for (const key of storeGet(grantKey) ?? []) store.delete(key);
    store.delete(grantKey);
  }
}

// ---------------------------------------------------------------------------
// provider construction

function providerConfiguration() {
  return {
    adapter: SharedMemoryAdapter,
    clients: [
      {
        client_id: 'tessera',
        client_secret: 'tessera-secret',
        // oidc-provider also accepts client_secret_post for a client registered
        // with client_secret_basic (and vice versa).
        token_endpoint_auth_method: 'client_secret_basic',
        grant_types: ['authorization_code', 'refresh_token'],
        response_types: ['code'],
        redirect_uris: config.redirect_uris,
        post_logout_redirect_uris: config.post_logout_redirect_uris,
      },
      {
        client_id: 'ci',
        client_secret: 'ci-secret',
        token_endpoint_auth_method: 'client_secret_basic',
        grant_types: ['client_credentials'],
        response_types: [],
        redirect_uris: [],
      },
    ],
    jwks: { keys },
    findAccount,
    scopes: ['openid', 'profile', 'email', 'groups', 'offline_access'],
    claims: {
      openid: ['sub'],
      profile: ['name', 'preferred_username'],
      email: ['email', 'email_verified'],
      groups: ['groups'],
    },
    // the ID token carries every claim of the granted scopes (groups included)
    conformIdTokenClaims: false,
    routes: ROUTES,
    interactions: {
      url(_ctx, interaction) {
        return `/interaction/${interaction.uid}`;
      },
    },
    cookies: {
      keys: ['tessera-test-oidc-cookie-key-1', 'tessera-test-oidc-cookie-key-0'],
    },
    pkce: {
      // PKCE is verified whenever the authorization request carried a
      // code_challenge, but not demanded.
      required: () => false,
    },
    features: {
      devInteractions: { enabled: false },
      clientCredentials: { enabled: true },
      introspection: { enabled: true },
      revocation: { enabled: true },
      rpInitiatedLogout: {
        enabled: true,
        // Auto-submitting confirmation page that already says "logout=yes".
        // A non-browser client can also POST xsrf + logout=yes itself.
        async logoutSource(ctx, form) {
          ctx.type = 'html';
          const withLogout = form.replace('</form>', '<input type="hidden" name="logout" value="yes"/><noscript><button type="submit">Sign out</button></noscript></form>');
          ctx.body = `<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>Logout</title>
<script>document.addEventListener('DOMContentLoaded', function () { document.forms[0].submit() });</script>
</head><body>${withLogout}</body></html>`;
        },
        async postLogoutSuccessSource(ctx) {
          ctx.type = 'html';
          ctx.body = '<!DOCTYPE html><html><head><meta charset="utf-8"><title>Signed out</title></head><body><p>signed out</p></body></html>';
        },
      },
      resourceIndicators: {
        enabled: true,
        // No resource parameter -> opaque access token for userinfo, except
        // for client credentials of `ci`, which default to the API.
        async defaultResource(ctx, client, oneOf) {
          if (oneOf) return oneOf;
          if (client?.clientId === 'ci' && ctx.oidc.params?.grant_type === 'client_credentials') {
            return API_RESOURCE_URI;
          }
          return undefined;
        },
        // If the authorization request carried resource=tessera-api, the code
        // exchange yields a JWT access token for it even without repeating it.
        async useGrantedResource() {
          return true;
        },
        async getResourceServerInfo(_ctx, resourceIndicator) {
          if (resourceIndicator === API_RESOURCE_URI) {
            return {
              scope: API_SCOPE,
              audience: API_AUDIENCE,
              accessTokenTTL: TOKEN_TTL,
              accessTokenFormat: 'jwt',
              jwt: { sign: { alg: 'RS256' } },
            };
          }
          throw new oidcErrors.InvalidTarget();
        },
      },
    },
    // Extra claims of access tokens (JWT ones show them directly):
    //  - client credentials: groups = ci_groups from the config
    //  - user access tokens: groups of the account
    async extraTokenClaims(_ctx, token) {
      if (token.kind === 'ClientCredentials') {
        return { groups: config.ci_groups };
      }
      if (token.kind === 'AccessToken' && token.accountId) {
        const record = accountRecord(token.accountId);
        return { groups: Array.isArray(record.groups) ? record.groups : [] };
      }
      return undefined;
    },
    formats: {
      customizers: {
        // A client-credentials JWT requested without `scope` still says scope=api.
        async jwt(_ctx, token, jwt) {
          if (token.kind === 'ClientCredentials' && !jwt.payload.scope) {
            jwt.payload.scope = API_SCOPE;
          }
        },
      },
    },
    ttl: {
      AccessToken: TOKEN_TTL,
      ClientCredentials: TOKEN_TTL,
      IdToken: TOKEN_TTL,
      AuthorizationCode: 60,
      RefreshToken: 24 * 60 * 60,
      Interaction: 60 * 60,
      Session: 24 * 60 * 60,
      Grant: 24 * 60 * 60,
    },
    renderError(ctx, out, _error) {
      ctx.type = 'html';
      const esc = (s) => String(s).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
      ctx.body = `<!DOCTYPE html><html><head><meta charset="utf-8"><title>oops</title></head><body><pre>${
        Object.entries(out).map(([k, v]) => `${esc(k)}: ${esc(v)}`).join('\n')
      }</pre></body></html>`;
    },
  };
}

// ---------------------------------------------------------------------------
// HTTP plumbing

let issuer;
let provider;
let providerCallback;

const stats = { jwks_requests: 0, discovery_requests: 0, token_requests: 0 };

function buildProvider() {
  const p = new Provider(issuer, providerConfiguration());
  p.on('server_error', (_ctx, err) => log('server_error:', err?.stack ?? err));
  p.on('grant.error', (_ctx, err) => log('grant.error:', err?.error ?? '', err?.error_description ?? err?.message ?? ''));
  p.on('authorization.error', (_ctx, err) => log('authorization.error:', err?.error ?? '', err?.error_description ?? err?.message ?? ''));
  p.on('end_session.error', (_ctx, err) => log('end_session.error:', err?.error ?? '', err?.error_description ?? err?.message ?? ''));
  provider = p;
  providerCallback = p.callback();
}

function sendJson(res, status, body) {
  const payload = JSON.stringify(body);
  res.writeHead(status, {
    'content-type': 'application/json; charset=utf-8',
    'content-length': Buffer.byteLength(payload),
    'cache-control': 'no-store',
  });
  res.end(payload);
}

function sendHtml(res, status, body) {
  res.writeHead(status, {
    'content-type': 'text/html; charset=utf-8',
    'content-length': Buffer.byteLength(body),
    'cache-control': 'no-store',
  });
  res.end(body);
}

function escapeHtml(s) {
  return String(s).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

function readBody(req, limit = 64 * 1024) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    let size = 0;
    req.on('data', (chunk) => {
      size += chunk.length;
      if (size > limit) {
        reject(new Error('body too large'));
        req.destroy();
        return;
      }
      chunks.push(chunk);
    });
    req.on('end', () => resolve(Buffer.concat(chunks).toString('utf8')));
    req.on('error', reject);
  });
}

function rewriteResourceParams(params) {
  let changed = false;
  const rewritten = new URLSearchParams();
  for (const [k, v] of params) {
    if (k === 'resource' && v === API_AUDIENCE) {
      rewritten.append(k, API_RESOURCE_URI);
      changed = true;
    } else {
      rewritten.append(k, v);
    }
  }
  return changed ? rewritten : undefined;
}

// Accept the bare `tessera-api` resource indicator (see API_RESOURCE_URI).
async function rewriteResourceAlias(req, url) {
  const query = rewriteResourceParams(url.searchParams);
  if (query) req.url = `${url.pathname}?${query}`;

  const contentType = (req.headers['content-type'] ?? '').split(';')[0].trim().toLowerCase();
  if (req.method === 'POST' && contentType === 'application/x-www-form-urlencoded') {
    // Consume the body; oidc-provider falls back to req.body when the stream is drained.
    const raw = await readBody(req, 56 * 1024);
    const body = rewriteResourceParams(new URLSearchParams(raw));
    req.body = body ? body.toString() : raw;
  }
}

async function interactionPage(req, res, uid) {
  const p = provider;
  const details = await p.interactionDetails(req, res);
  if (details.uid !== uid) {
    sendHtml(res, 400, '<!DOCTYPE html><p>interaction mismatch</p>');
    return;
  }
  const { prompt: { name, details: promptDetails }, params, session } = details;

  if (name === 'login') {
    const body = `<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>Sign in</title></head>
<body>
<h1>Sign in to ${escapeHtml(params.client_id)}</h1>
<form method="post" action="/interaction/${escapeHtml(uid)}/login">
<input name="login" autofocus placeholder="login">
<button type="submit">Sign in</button>
</form>
</body></html>`;
    sendHtml(res, 200, body);
    return;
  }

  if (name === 'consent') {
    // Grant every requested scope/claim/resource scope and finish at once.
    let { grantId } = details;
    let grant;
    if (grantId) {
      grant = await p.Grant.find(grantId);
    }
    if (!grant) {
      grantId = undefined;
      grant = new p.Grant({ accountId: session.accountId, clientId: params.client_id });
    }
    if (promptDetails.missingOIDCScope) {
      grant.addOIDCScope(promptDetails.missingOIDCScope.join(' '));
    }
    if (promptDetails.missingOIDCClaims) {
      grant.addOIDCClaims(promptDetails.missingOIDCClaims);
    }
    if (promptDetails.missingResourceScopes) {
      for (const [indicator, scopes] of Object.entries(promptDetails.missingResourceScopes)) {
        grant.addResourceScope(indicator, scopes.join(' '));
      }
    }
    const savedGrantId = await grant.save();
    const consent = {};
    if (!grantId) consent.grantId = savedGrantId;
    await p.interactionFinished(req, res, { consent }, { mergeWithLastSubmission: true });
    return;
  }

  sendHtml(res, 400, `<!DOCTYPE html><p>unsupported prompt ${escapeHtml(name)}</p>`);
}

async function interactionLogin(req, res, uid) {
  const p = provider;
  const details = await p.interactionDetails(req, res);
  if (details.uid !== uid || details.prompt.name !== 'login') {
    sendHtml(res, 400, '<!DOCTYPE html><p>not a login interaction</p>');
    return;
  }
  const form = new URLSearchParams(await readBody(req));
  const login = (form.get('login') ?? '').trim();
  if (!login) {
    sendHtml(res, 400, '<!DOCTYPE html><p>missing login</p>');
    return;
  }
  log(`login uid=${uid} account=${login}`);
  await p.interactionFinished(req, res, { login: { accountId: login } }, { mergeWithLastSubmission: false });
}

function rotate() {
  const key = newSigningKey();
  // newest first; keep the previous current key so tokens it signed still verify
  keys = [key, ...keys.slice(0, 1)];
  buildProvider();
  writeKeysFile();
  log(`rotated signing key, new kid=${key.kid}`);
  return key.kid;
}

async function handle(req, res) {
  const url = new URL(req.url, 'http://127.0.0.1');
  const { pathname } = url;

  if (pathname === ROUTES.jwks) stats.jwks_requests += 1;
  else if (pathname === DISCOVERY_PATH) stats.discovery_requests += 1;
  else if (pathname === ROUTES.token) stats.token_requests += 1;

  if (pathname === '/__test/rotate' && req.method === 'POST') {
    req.resume();
    sendJson(res, 200, { kid: rotate() });
    return;
  }
  if (pathname === '/__test/stats' && req.method === 'GET') {
    sendJson(res, 200, { ...stats });
    return;
  }

  let m = /^\/interaction\/([^/]+)$/.exec(pathname);
  if (m && req.method === 'GET') {
    await interactionPage(req, res, m[1]);
    return;
  }
  m = /^\/interaction\/([^/]+)\/login$/.exec(pathname);
  if (m && req.method === 'POST') {
    await interactionLogin(req, res, m[1]);
    return;
  }

  if (pathname === ROUTES.token || pathname === ROUTES.authorization || pathname === ROUTES.pushed_authorization_request) {
    await rewriteResourceAlias(req, url);
  }

  providerCallback(req, res);
}

const server = http.createServer((req, res) => {
  handle(req, res).catch((err) => {
    log(`error handling ${req.method} ${req.url}:`, err?.stack ?? err);
    if (!res.headersSent) {
      const status = err?.statusCode && err.statusCode >= 400 && err.statusCode < 600 ? err.statusCode : 500;
      sendJson(res, status, { error: err?.error ?? 'server_error', error_description: err?.error_description ?? String(err?.message ?? err) });
    } else {
      res.destroy();
    }
  });
});

// ---------------------------------------------------------------------------
// lifecycle

function shutdown(reason) {
  log(`exiting: ${reason}`);
  process.exit(0);
}

process.on('SIGTERM', () => shutdown('SIGTERM'));
process.on('SIGINT', () => shutdown('SIGINT'));
process.on('SIGHUP', () => shutdown('SIGHUP'));
// Parent gone (stdout/stderr pipe closed): writes fail with EPIPE; just leave.
process.stdout.on('error', () => shutdown('stdout closed'));
process.stderr.on('error', () => process.exit(0));

if (!args.ignoreStdin) {
  process.stdin.on('end', () => shutdown('stdin closed'));
  process.stdin.on('close', () => shutdown('stdin closed'));
  process.stdin.on('error', () => shutdown('stdin error'));
  process.stdin.resume();
}

server.listen(args.port, args.host, () => {
  const { port } = server.address();
  issuer = args.issuer ?? `http://127.0.0.1:${port}`;
  try {
    buildProvider();
    writeKeysFile();
  } catch (err) {
    log('startup failed:', err?.stack ?? err);
    process.exit(1);
  }
  process.stdout.write(`${JSON.stringify({ issuer, port })}\n`);
  log(`listening, issuer ${issuer}`);
});
server.on('error', (err) => {
  log('server error:', err?.stack ?? err);
  process.exit(1);
});
