package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// TestReproducible: the same inputs give the same digest, whatever the
// files' own timestamps or the time of the build; a changed input gives a
// new one. (CI also runs `make image` twice and compares the digests.)
func TestReproducible(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "app")
	if err := os.WriteFile(bin, []byte("#!binary one"), 0o755); err != nil {
		t.Fatal(err)
	}
	ca := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(ca, []byte("-----BEGIN CERTIFICATE-----\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	opts := func(out string) options {
		return options{
			files: fileFlags{"/app=" + bin, "/sub/dir/app2=" + bin}, labels: fileFlags{"org.opencontainers.image.version=1.2.3"},
			tag: "example/app:1.2.3", out: filepath.Join(dir, out), docker: filepath.Join(dir, strings.TrimSuffix(out, ".tar")+".docker.tar"), entrypoint: "/app", user: "65532:65532",
			ca: ca, base: true, created: 1764576000,
		}
	}
	_, first, err := build(opts("one.tar"))
	if err != nil {
		t.Fatal(err)
	}
	// New mtimes on the inputs, a second later.
	time.Sleep(1100 * time.Millisecond)
	now := time.Now()
	if err := os.Chtimes(bin, now, now); err != nil {
		t.Fatal(err)
	}
	_, second, err := build(opts("two.tar"))
	if err != nil {
		t.Fatal(err)
	}
	if first != second {
		t.Fatalf("same inputs, different digests: %s vs %s", first, second)
	}
	one, _ := os.ReadFile(filepath.Join(dir, "one.tar"))
	two, _ := os.ReadFile(filepath.Join(dir, "two.tar"))
	if len(one) == 0 || string(one) != string(two) {
		t.Fatalf("the OCI archives differ (%d vs %d bytes)", len(one), len(two))
	}
	// The docker archive holds the same config: user, entrypoint, time.
	img, err := tarball.ImageFromPath(filepath.Join(dir, "two.docker.tar"), ptrTag(t, "example/app:1.2.3"))
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.Config.User != "65532:65532" || len(cf.Config.Entrypoint) != 1 || cf.Config.Entrypoint[0] != "/app" || cf.Created.Unix() != 1764576000 {
		t.Fatalf("config: user %q entrypoint %v created %s", cf.Config.User, cf.Config.Entrypoint, cf.Created)
	}
	if err := os.WriteFile(bin, []byte("#!binary two"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, third, err := build(opts("three.tar"))
	if err != nil {
		t.Fatal(err)
	}
	if third == first {
		t.Fatal("a changed binary kept the digest")
	}
}

func ptrTag(t *testing.T, s string) *name.Tag {
	tag, err := name.NewTag(s)
	if err != nil {
		t.Fatal(err)
	}
	return &tag
}
