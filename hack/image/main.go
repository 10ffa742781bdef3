// Command image builds a container image without a Docker engine, with
// go-containerregistry: one layer holding the given files (plus, with -base,
// the few files a distroless base has: /etc/passwd and /etc/group with
// nonroot 65532, CA certificates, an empty /tmp), a config with the
// entrypoint and user, and writes it as a docker archive (`ctr images
// import`, `docker load`, `kind load image-archive`) and, with -oci, as an
// OCI image layout directory. The build is reproducible: every timestamp is
// -created (the commit time, set by the Makefile), files are sorted and
// owned by root, so the same inputs give the same digest.
//
//	go run ./hack/image -tag idc-operator:v0.2.0 -out bin/idc-operator-image.tar \
//	  -base -file /manager=bin/linux/manager -file /idc-runtime=bin/linux/idc-runtime \
//	  -entrypoint /manager -user 65532:65532 -created 1764576000
package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

type fileFlags []string

func (f *fileFlags) String() string     { return strings.Join(*f, ",") }
func (f *fileFlags) Set(v string) error { *f = append(*f, v); return nil }

// entry is one file of the layer.
type entry struct {
	path string
	mode int64
	data []byte
	dir  bool
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		files                                  fileFlags
		tag, out, ociDir, entrypoint, user, ca string
		base                                   bool
		created                                int64
		labels                                 fileFlags
	)
	flag.Var(&files, "file", "DEST=SRC: add SRC at DEST (mode 0755); repeatable")
	flag.Var(&labels, "label", "KEY=VALUE image label; repeatable")
	flag.StringVar(&tag, "tag", "", "image reference, e.g. idc-operator:v0.2.0")
	flag.StringVar(&out, "out", "", "docker archive to write")
	flag.StringVar(&ociDir, "oci", "", "also write an OCI image layout into this directory")
	flag.StringVar(&entrypoint, "entrypoint", "", "entrypoint (one path)")
	flag.StringVar(&user, "user", "65532:65532", "user:group the image runs as")
	flag.StringVar(&ca, "ca", "/etc/ssl/certs/ca-certificates.crt", "CA bundle copied to /etc/ssl/certs/ca-certificates.crt with -base")
	flag.BoolVar(&base, "base", false, "add the distroless-style base files (passwd, group, CA certificates, /tmp)")
	flag.Int64Var(&created, "created", 0, "creation time, Unix seconds (SOURCE_DATE_EPOCH)")
	flag.Parse()
	if tag == "" || out == "" || entrypoint == "" || len(files) == 0 {
		return errors.New("-tag, -out, -entrypoint and at least one -file are required")
	}
	ref, err := name.NewTag(tag, name.WeakValidation)
	if err != nil {
		return fmt.Errorf("-tag: %w", err)
	}
	mtime := time.Unix(created, 0).UTC()

	entries, err := collect(files, base, ca)
	if err != nil {
		return err
	}
	layerTar, err := tarLayer(entries, mtime)
	if err != nil {
		return err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return err
	}
	img, err := mutate.Append(mutate.MediaType(empty.Image, types.OCIManifestSchema1), mutate.Addendum{
		Layer: layer, MediaType: types.OCILayer,
		History: v1.History{Created: v1.Time{Time: mtime}, CreatedBy: "hack/image", Comment: "binaries and base files"},
	})
	if err != nil {
		return err
	}
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = "amd64", "linux"
	cf.Created = v1.Time{Time: mtime}
	cf.Config.Entrypoint = []string{entrypoint}
	cf.Config.User = user
	cf.Config.WorkingDir = "/"
	cf.Config.Env = []string{"PATH=/", "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"}
	cf.Config.Labels = map[string]string{}
	for _, l := range labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok {
			return fmt.Errorf("-label %q: want KEY=VALUE", l)
		}
		cf.Config.Labels[k] = v
	}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return err
	}
	if img, err = mutate.CreatedAt(img, v1.Time{Time: mtime}); err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	if err := tarball.WriteToFile(out, ref, img); err != nil {
		return fmt.Errorf("writing %s: %w", out, err)
	}
	if ociDir != "" {
		_ = os.RemoveAll(ociDir)
		p, err := layout.Write(ociDir, empty.Index)
		if err != nil {
			return err
		}
		if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{
			"org.opencontainers.image.ref.name": ref.TagStr(),
			"io.containerd.image.name":          ref.Name(),
		})); err != nil {
			return err
		}
	}
	if err := os.WriteFile(out+".digest", []byte(digest.String()+"\n"), 0o644); err != nil {
		return err
	}
	fmt.Printf("%s %s %s\n", ref.Name(), digest, out)
	return nil
}

func collect(files []string, base bool, ca string) ([]entry, error) {
	var es []entry
	seenDirs := map[string]bool{}
	addDirs := func(p string) {
		for d := path.Dir(p); d != "/" && d != "."; d = path.Dir(d) {
			if !seenDirs[d] {
				seenDirs[d] = true
				es = append(es, entry{path: d, mode: 0o755, dir: true})
			}
		}
	}
	for _, f := range files {
		dst, src, ok := strings.Cut(f, "=")
		if !ok || !path.IsAbs(dst) {
			return nil, fmt.Errorf("-file %q: want /DEST=SRC", f)
		}
		data, err := os.ReadFile(src)
		if err != nil {
			return nil, err
		}
		addDirs(dst)
		es = append(es, entry{path: dst, mode: 0o755, data: data})
	}
	if base {
		certs, err := os.ReadFile(ca)
		if err != nil {
			return nil, fmt.Errorf("CA certificates (Debian's ca-certificates package): %w", err)
		}
		for _, e := range []entry{
			{path: "/etc/passwd", mode: 0o644, data: []byte("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
			{path: "/etc/group", mode: 0o644, data: []byte("root:x:0:\nnonroot:x:65532:\n")},
			{path: "/etc/ssl/certs/ca-certificates.crt", mode: 0o644, data: certs},
		} {
			addDirs(e.path)
			es = append(es, e)
		}
		es = append(es, entry{path: "/tmp", mode: 0o1777, dir: true}, entry{path: "/home/nonroot", mode: 0o700, dir: true})
		seenDirs["/home"] = true
		es = append(es, entry{path: "/home", mode: 0o755, dir: true})
	}
	sort.Slice(es, func(i, j int) bool { return es[i].path < es[j].path })
	return es, nil
}

func tarLayer(es []entry, mtime time.Time) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range es {
		h := &tar.Header{
			Name: strings.TrimPrefix(e.path, "/"), Mode: e.mode, ModTime: mtime,
			Uid: 0, Gid: 0, Format: tar.FormatPAX,
		}
		if e.path == "/home/nonroot" {
			h.Uid, h.Gid = 65532, 65532
		}
		if e.dir {
			h.Typeflag, h.Name = tar.TypeDir, h.Name+"/"
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if !e.dir {
			if _, err := tw.Write(e.data); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
