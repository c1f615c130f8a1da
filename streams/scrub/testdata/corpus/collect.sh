#!/usr/bin/env bash
# Collects the scrubber's clean corpus: ordinary output of real tools run on
# a Debian 12 machine (as root, with the Debian, npm and Go module registries
# reachable and nothing else), stored gzip-compressed by kind beside this
# script. corpus_test.go asserts that the shape rules redact none of it.
#
#   streams/scrub/testdata/corpus/collect.sh [section ...]
#
# Sections: apt sys python npm go git compile maven blobs http (default: all).
# Each section rewrites its own .gz file(s); re-running is safe. Packages it
# installs for the tools (maven plugins, gradle, pytest, uuid-runtime) stay
# installed; the demo packages it installs are purged again.
#
# Outputs are not byte-reproducible (timings, download order, dates), only
# reproducible in kind. Lines that look like real credentials would be
# dropped by the screen below; none were found when this corpus was made.
set -uo pipefail

# A clean environment: some tools print theirs (mvn -X does), and the
# corpus must hold nothing of the machine's but what the tools show.
if [ -z "${CORPUS_CLEAN_ENV:-}" ]; then
	exec env -i CORPUS_CLEAN_ENV=1 PATH="$PATH" HOME="$HOME" ${CORPUS_DIR:+CORPUS_DIR="$CORPUS_DIR"} bash "$0" "$@"
fi

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../../.." && pwd)
# CORPUS_DIR: where the .gz files go (default: beside this script).
out=${CORPUS_DIR:-$here}
work=$(mktemp -d /tmp/scrub-corpus.XXXXXX)
# serve runs in a command substitution: it records its servers' pids here.
cleanup() {
	[ -f "$work/pids" ] && while read -r p; do kill "$p" 2>/dev/null; done <"$work/pids"
	rm -rf "$work"
}
trap cleanup EXIT
raw=$work/raw
mkdir -p "$raw"
export DEBIAN_FRONTEND=noninteractive LC_ALL=C.UTF-8 TERM=dumb

# run FILE CMD...: append "$ CMD" and the command's stdout and stderr.
run() {
	local f=$1
	shift
	printf '$ %s\n' "$*" >>"$raw/$f"
	"$@" >>"$raw/$f" 2>&1 </dev/null
	printf '[exit %d]\n' $? >>"$raw/$f"
}
# runsh FILE 'shell text': the same for a shell pipeline.
runsh() {
	local f=$1
	shift
	printf '$ %s\n' "$1" >>"$raw/$f"
	bash -c "$1" >>"$raw/$f" 2>&1 </dev/null
	printf '[exit %d]\n' $? >>"$raw/$f"
}
# cap FILE BYTES: cut a raw file at a line end near BYTES.
cap() {
	local f=$raw/$1
	[ "$(stat -c %s "$f")" -le "$2" ] && return
	head -c "$2" "$f" | sed '$d' >"$f.cut" && mv "$f.cut" "$f"
}

# A local HTTP server on 127.0.0.1 for one directory; prints its port.
serve() {
	local dir=$1 log=$2 port
	port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
	python3 -m http.server --bind 127.0.0.1 --directory "$dir" "$port" >>"$log" 2>&1 &
	echo $! >>"$work/pids"
	for _ in $(seq 50); do curl -s -o /dev/null "http://127.0.0.1:$port/" && break; sleep 0.1; done
	echo "$port"
}

apt_section() {
	local f=apt.log
	rm -f "$raw/$f"
	run $f apt-get update
	# Tools the later sections use, then a few small demo packages, installed and purged.
	run $f apt-get -o DPkg::Lock::Timeout=900 install -y libmaven-compiler-plugin-java libmaven-resources-plugin-java \
		libmaven-jar-plugin-java libsurefire-java libmaven-install-plugin-java \
		libmaven-dependency-plugin-java libmaven-clean-plugin-java junit4 \
		python3-pytest python3-venv python3-wheel python3-setuptools uuid-runtime gradle
	run $f apt-get -o DPkg::Lock::Timeout=900 install -y figlet sl cowsay jq tree sqlite3 pv
	run $f apt-get -o DPkg::Lock::Timeout=900 install -y --reinstall jq tree
	run $f apt-get -o DPkg::Lock::Timeout=900 purge -y figlet sl cowsay jq tree sqlite3 pv
	run $f apt-get -o DPkg::Lock::Timeout=900 autoremove -y
	for p in default-jdk build-essential postgresql nginx texlive-latex-base php-cli ruby-full \
		rustc golang-go nodejs python3-scipy libreoffice-writer-nogui gnome-core; do
		run $f apt-get -s install "$p"
	done
	run $f apt-get -s upgrade
	run $f apt-get -s dist-upgrade
	runsh $f "dpkg-query -W -f='\${Package}\n' | xargs apt-cache show"
	runsh $f "apt-cache pkgnames | sort | head -3000 | tail -1500 | xargs apt-cache show"
	for p in curl git openssl python3 nodejs maven gradle libssl3 systemd; do
		run $f apt-cache policy "$p"
		run $f apt-cache depends "$p"
		run $f apt-cache rdepends "$p"
		run $f apt-cache showpkg "$p"
	done
	run $f apt-cache stats
	run $f apt list --installed
	runsh $f "apt-cache search --names-only '^lib.*-dev\$' | head -4000"
	cap $f 9000000
}

sys_section() {
	local f=sys.log
	rm -f "$raw/$f"
	# Package, file and system listings (not processes, sockets or the
	# journal: those would show the machine's own services).
	run $f dpkg -l
	runsh $f 'for p in $(dpkg-query -W -f="\${Package}\n" | head -40); do dpkg -L "$p"; done'
	runsh $f 'for p in coreutils bash openssl curl git libc6 systemd; do dpkg -s "$p"; done'
	runsh $f 'cat /var/lib/dpkg/info/*.md5sums | head -15000'
	run $f ls -la /usr/lib /usr/bin /usr/sbin /usr/lib/x86_64-linux-gnu
	runsh $f 'ls -laR /usr/share/doc/ | head -30000'
	run $f df -h /usr /tmp
	run $f cat /proc/cpuinfo /proc/meminfo /proc/self/status
	run $f uname -a
	runsh $f 'for u in $(find /lib/systemd/system -maxdepth 1 -type f \( -name "*.service" -o -name "*.socket" -o -name "*.timer" \)); do echo "# $u"; cat "$u"; done'
	runsh $f 'cat /var/log/dpkg.log /var/log/apt/history.log /var/log/alternatives.log 2>/dev/null | tail -30000'
	runsh $f 'zcat -f /var/log/apt/term.log* 2>/dev/null | head -20000'
	runsh $f 'for c in /usr/share/doc/*/changelog.Debian.gz; do echo "# $c"; zcat "$c" | head -150; done'
	runsh $f 'strace -f -tt -s 120 ls -la /usr/share 2>&1 >/dev/null | head -3000'
	runsh $f 'strace -f -c -S calls python3 -c "import json, ssl, sqlite3" 2>&1'
	runsh $f 'python3 -X importtime -c "import asyncio, json, http.client, email, xml.dom.minidom" 2>&1'
	cap $f 9000000
}

python_section() {
	local f=python.log venv=$work/venv pkg=$work/pyproj tests=$work/pytests
	rm -f "$raw/$f"
	run $f /usr/bin/python3 -m venv --system-site-packages "$venv"
	run $f "$venv/bin/pip" --version
	run $f "$venv/bin/pip" list -v
	run $f pip3 list -v
	run $f pip3 freeze --all
	runsh $f 'pip3 list --format=freeze | cut -d= -f1 | head -60 | xargs pip3 show -f'
	run $f pip3 debug --verbose
	# PyPI is not reachable: what pip prints then is ordinary output too.
	run $f "$venv/bin/pip" install --retries 1 --timeout 3 requests==2.32.3 flask
	run $f "$venv/bin/pip" download --retries 0 --timeout 3 -d "$work/dl" numpy
	# A real local package, built and installed verbosely.
	mkdir -p "$pkg/src/corpusdemo"
	cat >"$pkg/pyproject.toml" <<-'EOF'
		[build-system]
		requires = ["setuptools>=61"]
		build-backend = "setuptools.build_meta"
		[project]
		name = "corpusdemo"
		version = "0.3.1"
		description = "demo package for the scrubber corpus"
		requires-python = ">=3.9"
		[project.scripts]
		corpusdemo = "corpusdemo:main"
	EOF
	printf 'def main():\n    print("corpusdemo ok")\n' >"$pkg/src/corpusdemo/__init__.py"
	run $f "$venv/bin/pip" install -v --no-index --no-build-isolation "$pkg"
	run $f "$venv/bin/pip" show -f corpusdemo
	run $f "$venv/bin/pip" wheel -v --no-index --no-build-isolation -w "$work/wheels" "$pkg"
	run $f "$venv/bin/pip" uninstall -y corpusdemo
	# A generated pytest suite with passes, failures, errors and skips.
	mkdir -p "$tests"
	/usr/bin/python3 - "$tests" <<-'EOF'
		import sys, os
		d = sys.argv[1]
		for m in range(12):
		    with open(os.path.join(d, f"test_mod{m:02d}.py"), "w") as f:
		        f.write("import json, math, hashlib, uuid, pytest\n\n")
		        f.write(f"@pytest.mark.parametrize('n', range({40 + m * 7}))\n")
		        f.write("def test_square(n):\n    assert math.isqrt(n * n) == n\n\n")
		        f.write("@pytest.mark.parametrize('s', ['alpha', 'beta', 'gamma', 'delta'])\n")
		        f.write("def test_digest(s):\n    h = hashlib.sha256(s.encode()).hexdigest()\n    assert len(h) == 64\n\n")
		        f.write(f"def test_json_roundtrip():\n    d = {{'id': str(uuid.uuid4()), 'n': {m}, 'tags': ['a', 'b']}}\n    assert json.loads(json.dumps(d)) == d\n\n")
		        if m % 3 == 0:
		            f.write("def test_dict_diff():\n    got = {'name': 'svc', 'replicas': 3, 'image': 'registry.example/app:1.4.2', 'ports': [80, 443]}\n    assert got == {'name': 'svc', 'replicas': 2, 'image': 'registry.example/app:1.4.3', 'ports': [80, 8443]}\n\n")
		        if m % 4 == 1:
		            f.write("def test_hash_mismatch():\n    assert hashlib.sha1(b'x').hexdigest() == hashlib.sha1(b'y').hexdigest()\n\n")
		        if m % 5 == 2:
		            f.write("@pytest.fixture\ndef broken():\n    raise RuntimeError('fixture failed to start')\n\ndef test_uses_broken(broken):\n    pass\n\n")
		        f.write("@pytest.mark.skip(reason='not on this platform')\ndef test_skipped():\n    pass\n\n")
		        f.write("@pytest.mark.xfail(reason='known issue 1234')\ndef test_xfail():\n    assert 1 / 0\n")
	EOF
	runsh $f "cd '$tests' && /usr/bin/python3 -m pytest -v -rA --durations=20 -p no:cacheprovider"
	runsh $f "cd '$tests' && /usr/bin/python3 -m pytest -q --tb=long -p no:cacheprovider"
	for m in os json re asyncio subprocess pathlib typing collections itertools functools http.client \
		urllib.request email.message logging argparse datetime decimal sqlite3 ssl socket threading \
		unittest xml.etree.ElementTree zipfile tarfile hashlib base64 uuid str dict list bytes; do
		run $f python3 -m pydoc "$m"
	done
	runsh $f 'python3 -c "import json; json.loads(\"{bad\")"'
	runsh $f 'python3 -c "import collections; d = {}; d[\"missing\"]"'
	runsh $f 'python3 -c "def f(n): return f(n + 1)
f(0)" 2>&1 | head -60'
	runsh $f 'printf "def f(:\n  pass\n" > /tmp/corpus_bad.py; python3 /tmp/corpus_bad.py; rm -f /tmp/corpus_bad.py'
	cap $f 6000000
}

npm_section() {
	local f=npm.log d=$work/npmproj js=$raw/js.min.txt
	rm -f "$raw/$f" "$js"
	mkdir -p "$d"
	run $f npm --version
	runsh $f "cd '$d' && npm init -y"
	runsh $f "cd '$d' && npm install --loglevel verbose --no-fund --no-audit --cache '$work/npmcache' express lodash axios moment react react-dom jquery bootstrap d3 chart.js vue jsonwebtoken uuid dayjs"
	runsh $f "cd '$d' && npm install --loglevel verbose --no-fund --cache '$work/npmcache' --save-dev typescript eslint@8 webpack webpack-cli @babel/core @babel/preset-env jest prettier"
	runsh $f "cd '$d' && npm ls --all"
	runsh $f "cd '$d' && npm outdated"
	runsh $f "cd '$d' && npm audit"
	runsh $f "cd '$d' && npm view express"
	runsh $f "cd '$d' && npm view react versions --json"
	runsh $f "cd '$d' && npm explain ms"
	runsh $f "cd '$d' && cat package.json package-lock.json"
	runsh $f "cd '$d' && npx tsc --version && printf 'let x: number = \"s\";\nfunction f(a) { return a.b.c }\nimport {nope} from \"./missing\";\n' > bad.ts && npx tsc --strict --noEmit bad.ts"
	runsh $f "cd '$d' && printf 'const a = 1\nvar unused = 2;;\nif (a == null) { console.log(b) }\n' > bad.js && npx eslint --no-eslintrc --env browser --rule 'no-unused-vars: error' --rule 'no-undef: error' --rule 'eqeqeq: error' --rule 'no-extra-semi: error' bad.js"
	runsh $f "cd '$d' && node -e 'null.x'"
	runsh $f "cd '$d' && node -e 'require(\"./nope\")'"
	runsh $f "cd '$d' && ls -laR node_modules/.bin node_modules/@babel | head -3000"
	cap $f 9000000
	# Minified bundles and their source maps, as shipped in the packages.
	find "$d/node_modules" -type f \( -name '*.min.js' -o -name '*.prod.js' -o -name '*.production.min.js' -o -name '*.min.mjs' -o -name '*.min.css' -o -name '*.min.js.map' \) -size -3M |
		sort | while read -r p; do
			printf '// ==> %s <==\n' "${p#"$d/"}" >>"$js"
			cat "$p" >>"$js"
			printf '\n' >>"$js"
		done
	cap js.min.txt 12000000
}

go_section() {
	local f=go.log
	rm -f "$raw/$f"
	cd "$repo" || return
	run $f go version
	run $f go env
	run $f go mod graph
	run $f go list -m all
	run $f go list -m -json all
	run $f cat go.mod go.sum
	run $f go list -deps -f '{{.ImportPath}} {{.Dir}}' ./streams/... ./store/...
	# A fresh build cache so the compiler really runs (-x prints each command).
	run $f env GOCACHE="$work/gocache" go build -x -v ./streams/...
	run $f env GOCACHE="$work/gocache" go vet -x ./streams/...
	runsh $f "go test -v -short -count=1 \$(go list ./streams/... ./store/... | grep -v /scrub\$)"
	run $f go test -count=1 -short -cover ./store/...
	# Module downloads through the proxy into a fresh module cache.
	run $f env GOMODCACHE="$work/gomod" GOFLAGS=-modcacherw go mod download -x golang.org/x/time gopkg.in/yaml.v3 github.com/google/uuid github.com/spf13/cobra github.com/gorilla/websocket
	# Compiler, vet and test failures from a small broken module.
	local b=$work/gobroken
	mkdir -p "$b/pkg"
	printf 'module example.com/broken\n\ngo 1.22\n' >"$b/go.mod"
	cat >"$b/pkg/p.go" <<-'EOF'
		package pkg

		import (
			"fmt"
			"os"
			"strings"
		)

		type Store struct{ items map[string]int }

		func (s *Store) Add(k string, v int) error {
			s.items[k] = v
			fmt.Printf("added %d\n", k)
			return nil
		}

		func Broken() int {
			var x int = "string"
			y := undefined + 1
			return x
		}
	EOF
	cat >"$b/pkg/v.go" <<-'EOF'
		package pkg

		import (
			"fmt"
			"sync"
		)

		type T struct{ mu sync.Mutex }

		func Copy(t T) T { return t }

		func Fmt() string { return fmt.Sprintf("%d %s", "a") }
	EOF
	runsh $f "cd '$b' && go build ./..."
	sed -i '/func Broken/,$d' "$b/pkg/p.go"
	sed -i 's/"os"//; s/"strings"//' "$b/pkg/p.go"
	runsh $f "cd '$b' && go vet ./..."
	cat >"$b/pkg/p_test.go" <<-'EOF'
		package pkg

		import "testing"

		func TestAdd(t *testing.T) {
			s := &Store{}
			if err := s.Add("k", 1); err != nil {
				t.Fatal(err)
			}
		}

		func TestTable(t *testing.T) {
			for _, c := range []struct{ in, want string }{{"a", "a"}, {"b", "c"}, {"d", "d"}} {
				t.Run(c.in, func(t *testing.T) {
					if c.in != c.want {
						t.Errorf("got %q, want %q", c.in, c.want)
					}
				})
			}
		}
	EOF
	runsh $f "cd '$b' && go test -v -vet=off ./..."
	runsh $f "cd '$b' && go test -json -vet=off ./... | head -200"
	cd - >/dev/null || return
	cap $f 9000000
}

git_section() {
	local f=git.log
	rm -f "$raw/$f"
	cd "$repo" || return
	# The scrubber's own package and rule file hold sample tokens: left out.
	local ex=(-- . ':!streams/scrub' ':!configs/scrubber.yaml' ':!docs/BENCHMARKS.md')
	run $f git log --stat --format=fuller -n 400 "${ex[@]}"
	run $f git log --format='%H %h %T %P %an %ad %s' --date=iso-strict
	run $f git log -p --stat -n 120 "${ex[@]}"
	run $f git log --graph --oneline --decorate --all -n 400
	run $f git ls-tree -r -l HEAD
	run $f git rev-list --objects -n 60 HEAD
	run $f git count-objects -v
	run $f git shortlog -sn
	run $f git show --stat HEAD~5
	run $f git blame -l go.mod
	run $f git cat-file -p HEAD
	run $f git reflog -n 100
	cd - >/dev/null || return
	cap $f 6000000
}

compile_section() {
	local f=compile.log c=$work/c
	rm -f "$raw/$f"
	mkdir -p "$c"
	cat >"$c/a.c" <<-'EOF'
		#include <stdio.h>
		#include <stdlib.h>
		#include <string.h>

		struct conn { int fd; char host[64]; };

		static int parse(const char *s, int *out) {
			char buf[8];
			strcpy(buf, s);
			*out = atoi(buf)
			return 0;
		}

		int main(int argc, char **argv) {
			struct conn c;
			int n, unused;
			printf("%s\n", n);
			c.port = 80;
			parse(argv[1], &n, 3);
			undeclared_fn(c);
			return "done";
		}
	EOF
	cat >"$c/b.cpp" <<-'EOF'
		#include <algorithm>
		#include <list>
		#include <map>
		#include <string>
		#include <vector>
		#include <memory>

		struct Key { int a; };

		int main() {
			std::map<Key, std::string> m;
			m[Key{1}] = "x";
			std::list<int> l{3, 1, 2};
			std::sort(l.begin(), l.end());
			std::vector<std::unique_ptr<int>> v;
			auto w = v;
			std::string s = 42;
			return m.size();
		}
	EOF
	cat >"$c/ok.c" <<-'EOF'
		#include <stdio.h>
		int main(void) { int i; for (i = 0; i < 3; i++) printf("%d\n", i); return 0; }
	EOF
	run $f gcc --version
	run $f gcc -Wall -Wextra -c "$c/a.c" -o "$c/a.o"
	run $f g++ -Wall -std=c++17 -c "$c/b.cpp" -o "$c/b.o"
	run $f gcc -v -Wall -O2 "$c/ok.c" -o "$c/ok"
	run $f gcc -fsanitize=address -g "$c/ok.c" -o "$c/ok_asan"
	run $f "$c/ok_asan"
	run $f objdump -d --no-show-raw-insn "$c/ok"
	run $f readelf -a "$c/ok"
	run $f nm -D /usr/bin/curl
	runsh $f 'objdump -d /usr/bin/ls | head -60000'
	runsh $f 'objdump -x /usr/bin/git | head -3000'
	runsh $f 'printf "#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\n#include <pthread.h>\n#include <sys/socket.h>\n#include <netinet/in.h>\n" | gcc -E -dD -x c -'
	runsh $f 'printf "#include <iostream>\n#include <map>\n#include <regex>\n" | g++ -std=c++17 -E -x c++ - | head -40000'
	runsh $f 'printf "#include <stdio.h>\n" | gcc -H -fsyntax-only -x c - 2>&1'
	run $f ldd /usr/bin/curl /usr/bin/git /usr/bin/python3.11
	printf 'int main(void) { char *p = malloc(4); p[8] = 1; return 0; }\n' >"$c/heap.c"
	runsh $f "cd '$c' && gcc -include stdlib.h -fsanitize=address -g heap.c -o heap && ./heap"
	mkdir -p "$c/j"
	cat >"$c/j/Main.java" <<-'EOF'
		import java.util.*;
		public class Main {
			public static void main(String[] args) {
				List<String> xs = new ArrayList<>();
				xs.add(1);
				int n = "x";
				undefined();
				Map<String, Integer> m = new HashMap<>()
			}
		}
	EOF
	run $f javac -Xlint:all "$c/j/Main.java"
	sed -i 's/new HashMap<>()$/new HashMap<>();/' "$c/j/Main.java"
	run $f javac -Xlint:all "$c/j/Main.java"
	printf 'public class T { public static void main(String[] a) { Object o = null; System.out.println(o.toString()); } }\n' >"$c/j/T.java"
	runsh $f "cd '$c/j' && javac T.java && java -cp . T"
	cap $f 6000000
}

maven_section() {
	local f=maven.log m=$work/mvn repoext=$work/m2ext
	rm -f "$raw/$f"
	# Maven Central is not reachable. A local mirror on 127.0.0.1 serves
	# Debian's /usr/share/maven-repo plus stand-ins (a pom and a tiny jar
	# built here) at the real coordinates of jjwt, so Maven's own download,
	# build and dependency-tree output names io.jsonwebtoken:jjwt-api:0.12.6.
	mkdir -p "$repoext" "$m/src/main/java/demo" "$m/src/test/java/demo"
	for a in jjwt-api jjwt-impl jjwt-jackson; do
		local ad=$repoext/io/jsonwebtoken/$a/0.12.6 cls=$work/cls/$a
		mkdir -p "$ad" "$cls/io/jsonwebtoken"
		printf 'package io.jsonwebtoken;\npublic final class Stub_%s { }\n' "${a//-/_}" >"$cls/io/jsonwebtoken/Stub_${a//-/_}.java"
		javac -d "$cls" "$cls/io/jsonwebtoken/"*.java
		(cd "$cls" && jar cf "$ad/$a-0.12.6.jar" io)
		cat >"$ad/$a-0.12.6.pom" <<-EOF
			<?xml version="1.0" encoding="UTF-8"?>
			<project xmlns="http://maven.apache.org/POM/4.0.0">
			  <modelVersion>4.0.0</modelVersion>
			  <groupId>io.jsonwebtoken</groupId>
			  <artifactId>$a</artifactId>
			  <version>0.12.6</version>
			  <packaging>jar</packaging>
			</project>
		EOF
		for x in jar pom; do sha1sum "$ad/$a-0.12.6.$x" | cut -d' ' -f1 >"$ad/$a-0.12.6.$x.sha1"; done
	done
	local mr=$work/mirror
	mkdir -p "$mr"
	cp -rs /usr/share/maven-repo/. "$mr/"
	cp -r "$repoext/io" "$mr/"
	# Checksums beside each file, as a real repository has them.
	find -L "$mr" -type f \( -name '*.pom' -o -name '*.jar' \) -print0 | xargs -0 sha1sum |
		while read -r h p; do echo "$h" >"$p.sha1"; done
	local port
	port=$(serve "$mr" "$work/mirror-http.log")
	cat >"$m/settings.xml" <<-EOF
		<settings>
		  <localRepository>$work/m2</localRepository>
		  <mirrors><mirror><id>local-mirror</id><mirrorOf>*</mirrorOf><url>http://127.0.0.1:$port/</url></mirror></mirrors>
		</settings>
	EOF
	v() { ls /usr/share/maven-repo/org/apache/maven/plugins/"$1"/ 2>/dev/null | grep -v debian | sort -V | tail -1; }
	local surefire
	surefire=$(ls /usr/share/maven-repo/org/apache/maven/surefire/surefire/ | grep -v debian | sort -V | tail -1)
	cat >"$m/pom.xml" <<-EOF
		<?xml version="1.0" encoding="UTF-8"?>
		<project xmlns="http://maven.apache.org/POM/4.0.0" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
		         xsi:schemaLocation="http://maven.apache.org/POM/4.0.0 http://maven.apache.org/xsd/maven-4.0.0.xsd">
		  <modelVersion>4.0.0</modelVersion>
		  <groupId>com.example</groupId>
		  <artifactId>token-service</artifactId>
		  <version>1.4.0-SNAPSHOT</version>
		  <packaging>jar</packaging>
		  <properties>
		    <maven.compiler.source>17</maven.compiler.source>
		    <maven.compiler.target>17</maven.compiler.target>
		    <project.build.sourceEncoding>UTF-8</project.build.sourceEncoding>
		    <jjwt.version>0.12.6</jjwt.version>
		  </properties>
		  <dependencies>
		    <dependency><groupId>io.jsonwebtoken</groupId><artifactId>jjwt-api</artifactId><version>\${jjwt.version}</version></dependency>
		    <dependency><groupId>io.jsonwebtoken</groupId><artifactId>jjwt-impl</artifactId><version>\${jjwt.version}</version><scope>runtime</scope></dependency>
		    <dependency><groupId>io.jsonwebtoken</groupId><artifactId>jjwt-jackson</artifactId><version>\${jjwt.version}</version><scope>runtime</scope></dependency>
		    <dependency><groupId>commons-io</groupId><artifactId>commons-io</artifactId><version>debian</version></dependency>
		    <dependency><groupId>junit</groupId><artifactId>junit</artifactId><version>4.x</version><scope>test</scope></dependency>
		  </dependencies>
		  <build>
		    <pluginManagement><plugins>
		      <plugin><groupId>org.apache.maven.plugins</groupId><artifactId>maven-clean-plugin</artifactId><version>$(v maven-clean-plugin)</version></plugin>
		      <plugin><groupId>org.apache.maven.plugins</groupId><artifactId>maven-resources-plugin</artifactId><version>$(v maven-resources-plugin)</version></plugin>
		      <plugin><groupId>org.apache.maven.plugins</groupId><artifactId>maven-compiler-plugin</artifactId><version>$(v maven-compiler-plugin)</version></plugin>
		      <plugin><groupId>org.apache.maven.plugins</groupId><artifactId>maven-surefire-plugin</artifactId><version>$surefire</version></plugin>
		      <plugin><groupId>org.apache.maven.plugins</groupId><artifactId>maven-jar-plugin</artifactId><version>$(v maven-jar-plugin)</version></plugin>
		      <plugin><groupId>org.apache.maven.plugins</groupId><artifactId>maven-install-plugin</artifactId><version>$(v maven-install-plugin)</version></plugin>
		      <plugin><groupId>org.apache.maven.plugins</groupId><artifactId>maven-dependency-plugin</artifactId><version>$(v maven-dependency-plugin)</version></plugin>
		    </plugins></pluginManagement>
		  </build>
		</project>
	EOF
	cat >"$m/src/main/java/demo/Tokens.java" <<-'EOF'
		package demo;

		import java.util.Base64;
		import java.nio.charset.StandardCharsets;

		public final class Tokens {
			private Tokens() {}
			public static String segment(String s) {
				return Base64.getUrlEncoder().withoutPadding().encodeToString(s.getBytes(StandardCharsets.UTF_8));
			}
		}
	EOF
	cat >"$m/src/test/java/demo/TokensTest.java" <<-'EOF'
		package demo;

		import static org.junit.Assert.assertEquals;
		import org.junit.Test;

		public class TokensTest {
			@Test public void encodesWithoutPadding() { assertEquals("YQ", Tokens.segment("a")); }
			@Test public void encodesUrlSafe() { assertEquals("-_8", Tokens.segment("\u00fb\u00ff")); }
			@Test public void failsOnPurpose() { assertEquals("eyJhbGciOiJub25lIn0", Tokens.segment("{\"alg\":\"none\"}")); }
		}
	EOF
	# Without the mirror: central is unreachable.
	runsh $f "cd '$m' && mvn -B -Dmaven.repo.local='$work/m2-offline' -o validate dependency:tree"
	runsh $f "cd '$m' && mvn -B -Dmaven.repo.local='$work/m2-online' compile"
	# With the mirror: downloads, compile, tests (one fails on purpose), jar, install.
	runsh $f "cd '$m' && mvn -B -s settings.xml install"
	runsh $f "cd '$m' && mvn -B -s settings.xml -Dmaven.test.failure.ignore=true install"
	runsh $f "cd '$m' && mvn -B -s settings.xml dependency:tree dependency:list"
	runsh $f "cd '$m' && mvn -B -s settings.xml -X -Dmaven.test.skip=true package | head -6000"
	runsh $f "cd '$m' && cat pom.xml target/surefire-reports/*.txt"
	# The mirror without jjwt: what a missing artifact looks like.
	rm -rf "$mr/io" "$work/m2/io"
	runsh $f "cd '$m' && mvn -B -s settings.xml -U compile"
	run $f cat "$work/mirror-http.log"
	# Gradle (Debian's 4.4.1), offline, against a file repository with the same artifacts.
	local g=$work/gradle
	mkdir -p "$g/src/main/java/demo"
	cp "$m/src/main/java/demo/Tokens.java" "$g/src/main/java/demo/"
	cat >"$g/build.gradle" <<-EOF
		apply plugin: 'java'
		repositories { maven { url 'file://$repoext' } }
		dependencies {
		    compile 'io.jsonwebtoken:jjwt-api:0.12.6'
		    runtime 'io.jsonwebtoken:jjwt-impl:0.12.6'
		    runtime 'io.jsonwebtoken:jjwt-jackson:0.12.6'
		}
	EOF
	echo "rootProject.name = 'token-service'" >"$g/settings.gradle"
	runsh $f "cd '$g' && timeout 600 gradle --offline --no-daemon --console=plain -g '$work/gradlehome' dependencies build --info"
	cap $f 6000000
}

blobs_section() {
	local f=blobs.txt
	rm -f "$raw/$f"
	# Ids and checksums first (a -race test run reads only the start).
	runsh $f 'for i in $(seq 2000); do uuidgen; done'
	runsh $f 'for i in $(seq 600); do uuidgen -t; uuidgen -r | tr a-f A-F; done'
	runsh $f 'for i in $(seq 3000); do read -r u </proc/sys/kernel/random/uuid; echo "$u"; done'
	runsh $f 'ls /usr/bin | head -800 | sed "s|^|/usr/bin/|" | xargs sha256sum'
	runsh $f 'ls /usr/bin | head -800 | sed "s|^|/usr/bin/|" | xargs sha1sum'
	runsh $f 'ls /usr/bin | head -800 | sed "s|^|/usr/bin/|" | xargs md5sum'
	runsh $f 'ls /usr/lib/x86_64-linux-gnu/*.so* | head -300 | xargs sha512sum'
	runsh $f 'ls /usr/lib/x86_64-linux-gnu/*.so* | head -300 | xargs b2sum'
	runsh $f 'ls /usr/bin | head -200 | sed "s|^|/usr/bin/|" | xargs sha256sum --tag'
	runsh $f 'ls /usr/bin | head -200 | sed "s|^|/usr/bin/|" | xargs openssl dgst -sha384'
	runsh $f 'find /usr/share/doc -name copyright | head -300 | xargs cksum'
	runsh $f "cd '$repo' && git rev-list --all | head -400"
	runsh $f "cd '$repo' && git ls-files -s | head -1500"
	runsh $f 'od -A x -t x1z -v /usr/bin/true | head -3000'
	runsh $f 'xxd /usr/bin/true | head -3000'
	runsh $f 'hexdump -C /usr/bin/true | head -2000'
	# Images as base64, wrapped and unwrapped, as data: URIs and in JSON.
	runsh $f 'find /usr/share -name "*.png" -size -60k | sort | head -400 | while read -r p; do echo "# $p"; base64 "$p"; done'
	runsh $f 'find /usr/share -name "*.png" -size -20k | sort | tail -200 | while read -r p; do printf "<img src=\"data:image/png;base64,%s\">\n" "$(base64 -w0 "$p")"; done'
	runsh $f 'find /usr/share -name "*.svg" -size -20k | sort | head -100 | while read -r p; do printf "{\"name\":\"%s\",\"data\":\"%s\"}\n" "${p##*/}" "$(base64 -w0 "$p")"; done'
	runsh $f 'find /usr/share/fonts /usr/share/javascript -type f -size -40k 2>/dev/null | sort | head -40 | while read -r p; do base64 -w 64 "$p"; done'
	runsh $f 'base64 /usr/bin/true | head -400'
	cap $f 9000000
}

http_section() {
	local f=http.log d=$work/www port
	rm -f "$raw/$f"
	mkdir -p "$d/api"
	cp /usr/share/doc/curl/copyright "$d/LICENSE.txt" 2>/dev/null
	find /usr/share -name '*.png' -size -30k | head -5 | xargs -I{} cp {} "$d/"
	printf '{"id":"%s","status":"ok","items":[1,2,3]}\n' "$(cat /proc/sys/kernel/random/uuid)" >"$d/api/status.json"
	port=$(serve "$d" "$work/http-server.log")
	for p in / /LICENSE.txt /api/status.json /api/ /missing /api/status.json?page=2\&per_page=50; do
		run $f curl -v -sS -o /dev/null "http://127.0.0.1:$port$p"
		run $f curl -sS -i "http://127.0.0.1:$port$p"
	done
	run $f curl -v -sS -X POST -H 'Content-Type: application/json' -d '{"name":"demo"}' "http://127.0.0.1:$port/api/status.json"
	run $f curl -v -sS -I -H 'Accept: application/json' -H 'X-Request-Id: 7f3c2a9e' "http://127.0.0.1:$port/api/status.json"
	run $f curl --trace-ascii - -sS -o /dev/null "http://127.0.0.1:$port/api/status.json"
	run $f wget -S -O /dev/null "http://127.0.0.1:$port/LICENSE.txt"
	run $f python3 -c "import urllib.request as u, http.client as h; h.HTTPConnection.debuglevel = 1; print(u.urlopen('http://127.0.0.1:$port/api/status.json').read())"
	runsh $f "node -e \"require('http').get('http://127.0.0.1:$port/api/status.json', r => { console.log(r.statusCode, JSON.stringify(r.headers, null, 2)); r.pipe(process.stdout) })\""
	sleep 0.3
	run $f cat "$work/http-server.log"
	run $f curl -v -sS --max-time 3 https://example.invalid/
	cap $f 2000000
}

# The credential screen. Lines with what is a credential by its form (a
# private key, a token of a known family in full, a password in a URL, a
# quoted literal given to a name ending in secret, token or password (the
# repository's tests, pydoc's urllib example), an environment variable
# named *SECRET*, *PASSWORD* or *TOKEN* set to a value)
# are dropped and printed: the repository's own tests hold such strings on
# purpose. Lines where only a keyword stands before a long value are printed
# for a person to look at and kept: they are mostly code
# ("withXSRFToken: defaultToConfig2"), which the rules must leave alone.
drop_re='-----BEGIN [A-Z ]*PRIVATE KEY|(ghp|gho|ghs|ghu|ghr|github_pat)_[A-Za-z0-9_]{30,}|AKIA[A-Z0-9]{16}|xox[abposr]-[0-9A-Za-z-]{10,}|\bsk-[A-Za-z0-9_-]{30,}|glpat-[A-Za-z0-9_-]{20}|npm_[A-Za-z0-9]{36}|pypi-AgE|AIza[0-9A-Za-z_-]{35}|[a-z][a-z0-9+.-]*://[^/ :@"]+:[^/ @"]+@|\b[A-Z0-9_]*(SECRET|PASSWORD|TOKEN)[A-Z0-9_]*=[A-Za-z0-9_./+-]{8,}|passw(or)?d[A-Za-z_]*['"'"'"]?[[:space:]]*[=:][[:space:]]*['"'"'"][^'"'"'" ]{4,}['"'"'"]|([Ss]ecret|SECRET|[Tt]oken|TOKEN|[Pp]assw(or)?d|PASSW(OR)?D)["'"'"'"]?[[:space:]]*(:=|=|:)[[:space:]]*["'"'"'"][A-Za-z0-9_-]{6,}["'"'"'"]'
look_re='(password|passwd|secret|token|_auth)["'"'"']?[[:space:]]*[:=][[:space:]]*["'"'"']?[A-Za-z0-9+/_-]{16,}'
screen() {
	local r=$1
	if grep -n -a -E -e "$drop_re" "$r" >"$r.dropped"; then
		echo "!! $r: dropped by the credential screen:" >&2
		cut -c1-200 "$r.dropped" >&2
		cut -d: -f1 "$r.dropped" | sed 's/$/d/' | sed -i -f - "$r"
	fi
	if grep -n -a -o -i -E ".{0,40}($look_re).{0,20}" "$r" >"$r.look"; then
		echo "?? $r: $(wc -l <"$r.look") keyword-value lines kept, e.g.:" >&2
		head -5 "$r.look" | cut -c1-200 >&2
	fi
}

# --pack DIR: only screen and compress raw files already collected in DIR.
if [ "${1:-}" = --pack ]; then
	cp -a "$2/." "$raw/"
	set --
	sections=(none)
else
	sections=("$@")
fi
none_section() { :; }
[ ${#sections[@]} -eq 0 ] && sections=(apt sys python npm go git compile maven blobs http)
for s in "${sections[@]}"; do
	[ "$s" = none ] || echo "== $s" >&2
	"${s}_section"
done
cd "$raw" || exit 1
for r in *; do
	case $r in *.dropped | *.look) continue ;; esac
	screen "$r"
	gzip -n -9 <"$r" >"$out/$r.gz"
	printf '%-14s %10d raw %10d gz\n' "$r" "$(stat -c %s "$r")" "$(stat -c %s "$out/$r.gz")" >&2
done
