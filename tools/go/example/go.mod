module keyshift.local/example

go 1.19

require (
	github.com/lib/pq v1.10.7
	github.com/mattn/go-sqlite3 v1.14.16
	keyshift.local/keyshift v0.0.0
)

// No module proxy: the package is this tree's, the drivers Debian's
// (golang-github-lib-pq-dev, golang-github-mattn-go-sqlite3-dev, installed
// by tools/deps.sh).
replace (
	github.com/lib/pq => /usr/share/gocode/src/github.com/lib/pq
	github.com/mattn/go-sqlite3 => /usr/share/gocode/src/github.com/mattn/go-sqlite3
	keyshift.local/keyshift => ../keyshift
)
