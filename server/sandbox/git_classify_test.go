package sandbox

import "testing"

// git's messages name the failure; the URLs in them (a port with 403 in
// it, a repository named like a protocol) never decide the class.
func TestClassifyGit(t *testing.T) {
	for _, c := range []struct{ stderr, want string }{
		{"To https://git.sandboxd.test:40381/alice/app.git\n ! [rejected]        main -> main (fetch first)\nerror: failed to push some refs to 'https://git.sandboxd.test:40381/alice/app.git'\nhint: Updates were rejected because the remote contains work that you do not\n", GitRejected},
		{"error: failed to push some refs to 'https://git.example:4401/a/b.git'\n", GitRejected},
		{"error: RPC failed; HTTP 403 curl 22 The requested URL returned error: 403\nfatal: the remote end hung up unexpectedly\nerror: failed to push some refs to 'https://h/a/b.git'\n", GitNoAccess},
		{"fatal: unable to access 'https://git.example/ssl-tools/tls.git/': Could not resolve proxy: px\n", GitNetwork},
		{"fatal: repository 'https://git.example/ssl-tools/tls.git/' not found\n", GitNoAccess},
		{"fatal: unable to access 'https://h/a/b.git/': SSL certificate problem: unable to get local issuer certificate\n", GitNetwork},
		{"fatal: Remote branch nope not found in upstream origin\n", GitNoBranch},
		{"fatal: something new\n", GitOther},
	} {
		if got := classifyGit(c.stderr); got != c.want {
			t.Errorf("classifyGit(%q) = %s, want %s", c.stderr, got, c.want)
		}
	}
}
