package scrub

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// expandMarked turns a marked snippet into its input and the output the
// full rule set must give: «label|value» is value in the input and
// [REDACTED:label] in the output; everything else is the same in both.
func expandMarked(t *testing.T, marked string) (in, want string) {
	t.Helper()
	var ib, wb strings.Builder
	for {
		i := strings.Index(marked, "«")
		if i < 0 {
			ib.WriteString(marked)
			wb.WriteString(marked)
			return ib.String(), wb.String()
		}
		ib.WriteString(marked[:i])
		wb.WriteString(marked[:i])
		rest := marked[i+len("«"):]
		j := strings.Index(rest, "»")
		bar := strings.Index(rest, "|")
		if j < 0 || bar < 0 || bar > j {
			t.Fatalf("bad mark in %q", marked)
		}
		ib.WriteString(rest[bar+1 : j])
		wb.WriteString("[REDACTED:" + rest[:bar] + "]")
		marked = rest[j+len("»"):]
	}
}

// fakeValue is a deterministic stand-in for a long credential (base64
// alphabet, no provider prefix).
func fakeValue(seed uint64, n int) string {
	rnd := rand.New(rand.NewPCG(seed, 7))
	return randString(rnd, b64ch, n)
}

// TestContextSnippets runs realistic tool output through the full rule
// set: exactly the marked credentials are redacted (with the scheme, user
// names, hosts and paths around them kept), also when streamed in random
// pieces, with and without Flush.
func TestContextSnippets(t *testing.T) {
	longSession := fakeValue(1, 2600)
	longBearer := fakeValue(2, 3100)
	pemBody := strings.Join([]string{fakeValue(3, 64), fakeValue(4, 64), fakeValue(5, 64), fakeValue(6, 40) + "=="}, `\n`)
	cases := map[string]string{
		"curl -v HTTP/1.1": `$ curl -v --netrc https://api.example.com/v1/items
*   Trying 93.184.216.34:443...
* Connected to api.example.com (93.184.216.34) port 443
* Server auth using Basic with user 'deploy'
> GET /v1/items HTTP/1.1
> Host: api.example.com
> Authorization: Basic «authorization-header|ZGVwbG95OnM0bXBsZS1wYXNzdzByZA==»
> User-Agent: curl/8.5.0
> Accept: */*
>
< HTTP/1.1 200 OK
< Content-Type: application/json
< Set-Cookie: session=«cookie-header|Qm9ndXMtc2Vzc2lvbi0xMjM0NTY3ODkw; Path=/; HttpOnly»
< Vary: Origin, Authorization, Cookie
< Access-Control-Allow-Headers: Content-Type, Authorization, X-Requested-With
<
{"items":[]}
`,
		"curl -v HTTP/2": `* [HTTP/2] [1] OPENED stream for https://api.example.com/v1/me
* [HTTP/2] [1] [:method: GET]
* [HTTP/2] [1] [:authority: api.example.com]
* [HTTP/2] [1] [authorization: Bearer «authorization-header|` + longBearer + `»]
* [HTTP/2] [1] [user-agent: curl/8.5.0]
> GET /v1/me HTTP/2
> authorization: Bearer «authorization-header|` + longBearer + `»
> proxy-authorization: Basic «authorization-header|cHJveHk6czRtcGxlLXBhc3M=»
< HTTP/2 401
< www-authenticate: Bearer realm="api", error="invalid_token"
`,
		"curl command lines": `+ curl -sS --user '«cli-user-password|api:key-s4mple0123456789»' https://api.example.com/v3/domains
+ curl --proxy-user «cli-user-password|me:pr0xy-s4mple» -x http://proxy.internal:3128 https://example.com
+ curl -u deploy https://example.com/prompts-for-a-password
+ curl -H 'Authorization: token «authorization-header|S4mpleT0kenValue1234567890»' https://git.example.com/api/v1/user
+ sshpass -p «sshpass-password|s4mple-ssh-pw» ssh deploy@203.0.113.7 uptime
+ docker run --rm --user 1000:1000 -v "$PWD:/src" alpine:3.20 ls
+ pip install --user git+https://github.com/team/tool.git
`,
		"git remote -v": `origin	https://ci-bot:«url-password|S4mpleGitT0ken0123456789»@git.example.com/team/app.git (fetch)
origin	https://ci-bot:«url-password|S4mpleGitT0ken0123456789»@git.example.com/team/app.git (push)
gitlab	https://gitlab-ci-token:«url-password|S4mpleJobT0ken0123»@gitlab.example.com/group/app.git (fetch)
upstream	git@github.com:team/app.git (fetch)
mirror	ssh://git@git.example.com:2222/team/app.git (push)
public	https://github.com/team/app.git (fetch)
`,
		"pip.conf": `[global]
index-url = https://__token__:«url-password|S4mplePkgT0ken-0123456789abcdef»@pkgs.example.com/simple/
extra-index-url = https://deploy:«url-password|p%40ss-S4mple»@nexus.example.com:8443/repository/pypi/simple
trusted-host = nexus.example.com
timeout = 60
`,
		".npmrc": `registry=https://registry.npmjs.org/
//registry.npmjs.org/:_authToken=«generic-password|S4mpleNpmT0ken0123456789abcdef»
//npm.example.com/:_auth=«registry-basic-auth|ZGVwbG95OnM0bXBsZS1wYXNzdzByZA==»
//npm.example.com/:_password=«generic-password|czRtcGxlLXBhc3N3MHJk»
//npm.example.com/:username=deploy
//npm.example.com/:email=ci@example.com
always-auth=true
`,
		"settings.xml": `<settings>
  <servers>
    <server>
      <id>nexus</id>
      <username>deploy</username>
      <password>«xml-secret-element|s4mple Passw0rd with spaces & an &lt;escape&gt;»</password>
    </server>
    <server>
      <id>ssh-repo</id>
      <privateKey>${user.home}/.ssh/id_rsa</privateKey>
      <passphrase>«xml-secret-element|an0ther s4mple phrase»</passphrase>
    </server>
  </servers>
  <mirrors><mirror><id>m</id><url>https://nexus.example.com:8443/repository/maven-public/</url></mirror></mirrors>
</settings>
`,
		"docker config.json": `{
	"auths": {
		"registry.example.com": {
			"auth": "«registry-basic-auth|ZGVwbG95OnM0bXBsZS1wYXNzdzByZA==»"
		},
		"https://index.docker.io/v1/": {
			"auth": "«registry-basic-auth|dXNlcjpzNG1wbGUtaHViLXRva2Vu»",
			"identitytoken": "«generic-password|S4mpleIdentityT0ken0123456789»"
		}
	},
	"credsStore": "desktop"
}
`,
		"python http.client debug": `send: b'GET /v1/me HTTP/1.1\r\nHost: api.example.com\r\nUser-Agent: python-requests/2.32.3\r\nAccept-Encoding: gzip, deflate\r\nAccept: */*\r\nConnection: keep-alive\r\nAuthorization: Bearer «authorization-header|S4mpleBearer0123456789abcdef»\r\n\r\n'
reply: 'HTTP/1.1 200 OK\r\n'
header: Content-Type: application/json
DEBUG:urllib3.connectionpool:https://api.example.com:443 "GET /v1/me HTTP/1.1" 200 17
{'User-Agent': 'python-requests/2.32.3', 'Authorization': 'Bearer «authorization-header|S4mpleBearer0123456789abcdef»', 'Accept': '*/*'}
DEBUG:httpcore.http11:send_request_headers.started request=<Request [b'GET']>
[(b'Host', b'api.example.com'), (b'authorization', b'Bearer «authorization-header|S4mpleBearer0123456789abcdef»')]
`,
		"go dumps": `GET /v1/me HTTP/1.1
Host: api.example.com
Authorization: Bearer «authorization-header|S4mpleBearer0123456789abcdef»
Accept-Encoding: gzip

headers: map[Accept:[*/*] Authorization:[Bearer «authorization-header|S4mpleBearer0123456789abcdef»] User-Agent:[Go-http-client/1.1]]
config: {Host:db.internal Port:5432 User:app Password:«colon-secret|S4mple-db-Passw0rd» SSLMode:require}
`,
		"service account key": `{
  "type": "service_account",
  "project_id": "demo-project",
  "private_key_id": "0123456789abcdef0123456789abcdef01234567",
  "private_key": "«escaped-private-key|-----BEGIN PRIVATE KEY-----\n` + pemBody + `\n-----END PRIVATE KEY-----»\n",
  "client_email": "ci@demo-project.iam.gserviceaccount.com",
  "token_uri": "https://oauth2.googleapis.com/token"
}
`,
		"long tokens": `export AWS_SESSION_TOKEN=«generic-password|` + longSession + `»
[default]
aws_session_token = «generic-password|` + longSession + `»
{"Credentials": {"SessionToken": "«generic-password|` + longSession + `»", "Expiration": "2030-01-01T00:00:00Z"}}
password=«generic-password|abc&def;ghi,jkl)mno]pqr{stu}x» next
f(token=«generic-password|S4mpleKwarg18»)
"authorizationToken": "«generic-password|` + fakeValue(7, 12000) + `»",
`,
		"assignment styles": `REGISTRY_TOKEN ?= «generic-password|S4mpleMakeT0ken01»
DEPLOY_TOKEN ::= «generic-password|S4mpleMakeT0ken02»
$password .= "«generic-password|S4mplePhpPass03»";
var apiToken string = "«code-secret-literal|S4mpleGoT0ken04»"
const token = '«generic-password|S4mpleJsT0ken05»';
let secret = ` + "`«generic-password|S4mpleTplSecret06»`" + `
api_token: str = "«code-secret-literal|S4mple Py Token 07»"
const API_KEY: &str = "«code-secret-literal|S4mpleRustKey08»";
os.environ["API_KEY"] = "«code-secret-literal|S4mplePyKey09»"
System.setProperty("app.auth.token", "«secret-setter-call|S4mple Java T0ken 10»");
define('DB_PASSWORD', '«secret-setter-call|S4mple-wp-pass-11»');
<add key="ClearTextPassword" value="«xml-secret-attribute|S4mple NuGet 12»" />
+ export GITHUB_TOKEN=«generic-password|S4mpleTraceT0ken13»
+ SECRET_KEY=«secret-key|S4mpleTraceKey14» ./manage.py runserver
db.password: «generic-password|S4mplePropPass15»
password = "«generic-password|S4mpleTomlPass16»"
token: «generic-password|S4mpleYamlT0ken17»
`,
		"ordinary text": `tokens: 12345 in, 678 out
password: ****
Authorization: Bearer
Bearer token required
mail user@example.com or visit https://example.com:8080/path?next=/a@b
ssh git@github.com -p 22
curl -u user https://example.com
if token == nil { return errors.New("no token") }
max_tokens=4096 temperature=0.2
password_file=/run/secrets/db_password
token: ${{ secrets.GITHUB_TOKEN }}
<input type="password" name="pw" value="">
document.cookie = "theme=dark"
Vary: Accept-Encoding, Cookie
secretKey := make([]byte, 32)
"To receive authorization, the client sends the userid and password"
`,
	}
	rnd := rand.New(rand.NewPCG(9, 9))
	set := ruleSet(t)
	for name, marked := range cases {
		t.Run(name, func(t *testing.T) {
			in, want := expandMarked(t, marked)
			if got := set.RedactString(in); got != want {
				g, w := head2(got, want)
				t.Fatalf("Redact:\n got: %q\nwant: %q", g, w)
			}
			for rep := 0; rep < 20; rep++ {
				got := stream(t, set, []byte(in), randomSizes(rnd, len(in)), false)
				if string(got) != want {
					g, w := head2(string(got), want)
					t.Fatalf("streamed:\n got: %q\nwant: %q", g, w)
				}
				got = stream(t, set, []byte(in), randomSizes(rnd, len(in)), true)
				if err := flushEquivalent(set, []byte(in), got); err != nil {
					t.Fatalf("flushed: %v", err)
				}
			}
		})
	}
}

// head2 shows got and want from a little before their first difference.
func head2(got, want string) (string, string) {
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	from := max(0, i-120)
	return got[from:min(len(got), i+200)], want[from:min(len(want), i+200)]
}
