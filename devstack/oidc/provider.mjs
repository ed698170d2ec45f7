// The OpenID provider of the reliability tests: panva's oidc-provider (pinned in package.json
// and package-lock.json beside this file, installed by `make oidc-provider`), configured from
// the JSON file devstack/oidc_provider.py writes. Usage: node provider.mjs CONFIG.json
//
// It issues RFC 9068 JWT access tokens through the client credentials grant, for exactly one
// RFC 8707 resource the client is registered for; a token request without a resource gets an
// opaque token (oidc-provider's default), an unknown resource or a client not registered for
// it gets invalid_target. Clients authenticate with private_key_jwt or client_secret_basic,
// or are public ("none"): those use the device authorization grant (RFC 8628) and refresh
// tokens, and a person signs in on the provider's own pages (its development login and
// consent forms, which accept any login name: this provider stands in for a real one).
// With "clientAssertionAudience": "issuer" the provider runs its FAPI 2.0 profile, which
// accepts only the issuer identifier as a client assertion's audience.
//
// Readiness: once listening, it writes "ready" to the descriptor the settings name (readyFd,
// the harness's pipe) and closes it. It exits when its standard input closes, so it never outlives the harness.
// Each request is logged as one line "METHOD PATH STATUS [client=ID]" (never a query, a body
// or a header); GET /harness/requests answers the counts as JSON, for tests that count
// fetches: {"requests": {"METHOD /path": n}, "tokens": {"<client id>": {"<status>": n}}}.

import { closeSync, readFileSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';

const [configPath] = process.argv.slice(2);
if (!configPath) {
  console.error('usage: node provider.mjs CONFIG.json');
  process.exit(2);
}
const config = JSON.parse(readFileSync(configPath, 'utf8'));

// The package lives in the harness's cache, not beside this file: load it from there, and
// only the version this harness was written for.
const packageDir = join(config.modules, 'oidc-provider');
const manifest = JSON.parse(readFileSync(join(packageDir, 'package.json'), 'utf8'));
if (manifest.version !== config.version) {
  console.error(`oidc-provider ${manifest.version} is installed, ${config.version} is pinned`);
  process.exit(2);
}
const { default: Provider, errors } = await import(
  pathToFileURL(join(packageDir, manifest.main)).href
);

const deviceClients = config.clients.some((entry) => entry.auth === 'none');
const resources = new Map(config.resources.map((entry) => [entry.resource, entry]));

const DEVICE_CODE = 'urn:ietf:params:oauth:grant-type:device_code';

function clientMetadata(entry) {
  if (entry.auth === 'none') {
    return {
      client_id: entry.clientId,
      grant_types: [DEVICE_CODE, 'refresh_token'],
      response_types: [],
      redirect_uris: [],
      token_endpoint_auth_method: 'none',
    };
  }
  const common = {
    client_id: entry.clientId,
    grant_types: ['client_credentials'],
    response_types: [],
    redirect_uris: [],
  };
  if (entry.auth === 'private_key_jwt') {
    return { ...common, token_endpoint_auth_method: 'private_key_jwt', jwks: entry.jwks };
  }
  if (entry.auth === 'client_secret_basic') {
    return {
      ...common,
      token_endpoint_auth_method: 'client_secret_basic',
      client_secret: entry.secret,
    };
  }
  throw new TypeError(`client ${entry.clientId}: unknown auth ${entry.auth}`);
}

const provider = new Provider(config.issuer, {
  clients: config.clients.map(clientMetadata),
  jwks: { keys: config.signingKeys },
  cookies: { keys: [config.cookieKey] },
  clientAuthMethods: ['private_key_jwt', 'client_secret_basic', 'none'],
  // The first signing key is the default one: clients default to its algorithm, which must
  // be enabled (oidc-provider checks each client's defaults against its keys).
  clientDefaults: { id_token_signed_response_alg: config.signingKeys[0].alg },
  enabledJWA: {
    clientAuthSigningAlgValues: ['ES256', 'RS256', 'PS256'],
    idTokenSigningAlgValues: [...new Set(config.signingKeys.map((key) => key.alg))],
  },
  features: {
    devInteractions: { enabled: deviceClients },
    deviceFlow: { enabled: deviceClients },
    clientCredentials: { enabled: true },
    fapi:
      config.clientAssertionAudience === 'issuer'
        ? { enabled: true, profile: '2.0' }
        : { enabled: false },
    resourceIndicators: {
      enabled: true,
      // No resource asked for: no default, so the token is opaque.
      defaultResource: async () => undefined,
      useGrantedResource: async () => false,
      async getResourceServerInfo(_ctx, resourceIndicator, client) {
        const server = resources.get(resourceIndicator);
        if (!server || !server.clients.includes(client.clientId)) {
          throw new errors.InvalidTarget();
        }
        return {
          scope: server.scopes.join(' '),
          audience: server.audience,
          accessTokenFormat: 'jwt',
          accessTokenTTL: config.accessTokenSeconds,
          jwt: { sign: { alg: server.alg ?? config.signingKeys[0].alg } },
        };
      },
    },
  },
  ttl: {
    ClientCredentials: (_ctx, token) =>
      token.resourceServer?.accessTokenTTL ?? config.accessTokenSeconds,
  },
});

// Requests by "METHOD /path", and token answers by client id and status.
const counts = { requests: {}, tokens: {} };
provider.use(async (ctx, next) => {
  if (ctx.method === 'GET' && ctx.path === '/harness/requests') {
    ctx.body = counts;
    return;
  }
  try {
    await next();
  } finally {
    const line = `${ctx.method} ${ctx.path}`;
    counts.requests[line] = (counts.requests[line] ?? 0) + 1;
    // Set once the request named a registered client, whether or not it authenticated; a
    // client id is no secret.
    const clientId = ctx.oidc?.client?.clientId;
    if (ctx.oidc?.route === 'token' && clientId) {
      const byStatus = (counts.tokens[clientId] ??= {});
      byStatus[ctx.status] = (byStatus[ctx.status] ?? 0) + 1;
    }
    console.log(clientId ? `${line} ${ctx.status} client=${clientId}` : `${line} ${ctx.status}`);
  }
});

const server = provider.listen(config.port, config.host, () => {
  if (config.readyFd !== undefined) {
    writeSync(config.readyFd, 'ready\n');
    closeSync(config.readyFd);
  }
});
server.on('error', (error) => {
  console.error(`cannot listen on ${config.host}:${config.port}: ${error.code}`);
  process.exit(1);
});

function stop() {
  server.close(() => process.exit(0));
  server.closeAllConnections();
}
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
process.stdin.on('end', stop);
process.stdin.resume();
