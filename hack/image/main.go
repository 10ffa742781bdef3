// Command image builds a container image without a Docker engine, with
// go-containerregistry: one layer holding the given files (plus, with -base,
// the few files a distroless base has: /etc/passwd and /etc/group with
// nonroot 65532, CA certificates, an empty /tmp), a config with the
// entrypoint and user, and writes it as an OCI archive (`ctr images import`,
// `kind load image-archive`) and, with -docker, as a docker archive
// (`docker load`). The build is reproducible: every timestamp is
// -created (the commit time, set by the Makefile), files are sorted and
// owned by root, so the same inputs give the same digest.
//
//	go run ./hack/image -tag idc-operator:0.2.0 -out bin/idc-operator-image.tar \
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
	"io/fs"
	"os"
	"path"
	"path/filepath"
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

// options are the flags.
type options struct {
	files, labels                          fileFlags
	tag, out, docker, entrypoint, user, ca string
	base                                   bool
	created                                int64
}

func run() error {
	var o options
	flag.Var(&o.files, "file", "DEST=SRC: add SRC at DEST (mode 0755); repeatable")
	flag.Var(&o.labels, "label", "KEY=VALUE image label; repeatable")
	flag.StringVar(&o.tag, "tag", "", "image reference, e.g. idc-operator:v0.2.0")
	flag.StringVar(&o.out, "out", "", "OCI archive to write (ctr images import, kind load image-archive)")
	flag.StringVar(&o.docker, "docker", "", "also write a docker archive here (docker load)")
	flag.StringVar(&o.entrypoint, "entrypoint", "", "entrypoint (one path)")
	flag.StringVar(&o.user, "user", "65532:65532", "user:group the image runs as")
	flag.StringVar(&o.ca, "ca", "/etc/ssl/certs/ca-certificates.crt", "CA bundle copied to /etc/ssl/certs/ca-certificates.crt with -base")
	flag.BoolVar(&o.base, "base", false, "add the distroless-style base files (passwd, group, CA certificates, /tmp)")
	flag.Int64Var(&o.created, "created", 0, "creation time, Unix seconds (SOURCE_DATE_EPOCH)")
	flag.Parse()
	ref, digest, err := build(o)
	if err != nil {
		return err
	}
	fmt.Printf("%s %s %s\n", ref, digest, o.out)
	return nil
}

// build writes the image and returns its reference and manifest digest.
func build(o options) (string, v1.Hash, error) {
	var none v1.Hash
	if o.tag == "" || o.out == "" || o.entrypoint == "" || len(o.files) == 0 {
		return "", none, errors.New("-tag, -out, -entrypoint and at least one -file are required")
	}
	img, ref, err := assemble(o)
	if err != nil {
		return "", none, err
	}
	digest, err := img.Digest()
	if err != nil {
		return "", none, err
	}
	// The OCI archive keeps the manifest as built, so the digest containerd
	// (and the pod's imageID) reports is this one.
	dir, err := os.MkdirTemp("", "image-layout-")
	if err != nil {
		return "", none, err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return "", none, err
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": containerdName(ref),
		"io.containerd.image.name":          containerdName(ref),
	})); err != nil {
		return "", none, err
	}
	if err := tarDir(dir, o.out, time.Unix(o.created, 0)); err != nil {
		return "", none, fmt.Errorf("writing %s: %w", o.out, err)
	}
	if o.docker != "" {
		if err := tarball.WriteToFile(o.docker, ref, img); err != nil {
			return "", none, fmt.Errorf("writing %s: %w", o.docker, err)
		}
	}
	if err := os.WriteFile(o.out+".digest", []byte(digest.String()+"\n"), 0o644); err != nil {
		return "", none, err
	}
	// The image ID (its config's digest) is what the kubelet reports as a
	// container's imageID for an imported image.
	id, err := img.ConfigName()
	if err != nil {
		return "", none, err
	}
	if err := os.WriteFile(o.out+".id", []byte(id.String()+"\n"), 0o644); err != nil {
		return "", none, err
	}
	return containerdName(ref), digest, nil
}

// containerdName is the fully qualified name containerd and the kubelet
// use: docker.io/library/idc-operator:0.2.0 for idc-operator:0.2.0.
func containerdName(ref name.Tag) string {
	reg := ref.RegistryStr()
	if reg == name.DefaultRegistry {
		reg = "docker.io"
	}
	return reg + "/" + ref.RepositoryStr() + ":" + ref.TagStr()
}

// assemble builds the image in memory.
func assemble(o options) (v1.Image, name.Tag, error) {
	files, labels, tag, entrypoint, user, ca, base, created := o.files, o.labels, o.tag, o.entrypoint, o.user, o.ca, o.base, o.created
	ref, err := name.NewTag(tag, name.WeakValidation)
	if err != nil {
		return nil, name.Tag{}, fmt.Errorf("-tag: %w", err)
	}
	mtime := time.Unix(created, 0).UTC()

	entries, err := collect(files, base, ca)
	if err != nil {
		return nil, name.Tag{}, err
	}
	layerTar, err := tarLayer(entries, mtime)
	if err != nil {
		return nil, name.Tag{}, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, name.Tag{}, err
	}
	img, err := mutate.Append(mutate.MediaType(empty.Image, types.OCIManifestSchema1), mutate.Addendum{
		Layer: layer, MediaType: types.OCILayer,
		History: v1.History{Created: v1.Time{Time: mtime}, CreatedBy: "hack/image", Comment: "binaries and base files"},
	})
	if err != nil {
		return nil, name.Tag{}, err
	}
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, name.Tag{}, err
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
			return nil, name.Tag{}, fmt.Errorf("-label %q: want KEY=VALUE", l)
		}
		cf.Config.Labels[k] = v
	}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return nil, name.Tag{}, err
	}
	if img, err = mutate.CreatedAt(img, v1.Time{Time: mtime}); err != nil {
		return nil, name.Tag{}, err
	}
	return img, ref, nil
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

// tarDir writes the files under dir into a tar at out, sorted, owned by
// root, with one timestamp.
func tarDir(dir, out string, mtime time.Time) error {
	var paths []string
	if err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != dir {
			paths = append(paths, p)
		}
		return nil
	}); err != nil {
		return err
	}
	sort.Strings(paths)
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			return errors.Join(err, f.Close())
		}
		rel, _ := filepath.Rel(dir, p)
		h := &tar.Header{Name: filepath.ToSlash(rel), ModTime: mtime, Mode: 0o644, Format: tar.FormatPAX}
		if fi.IsDir() {
			h.Typeflag, h.Name, h.Mode = tar.TypeDir, h.Name+"/", 0o755
		} else {
			h.Typeflag, h.Size = tar.TypeReg, fi.Size()
		}
		if err := tw.WriteHeader(h); err != nil {
			return errors.Join(err, f.Close())
		}
		if !fi.IsDir() {
			b, err := os.ReadFile(p)
			if err != nil {
				return errors.Join(err, f.Close())
			}
			if _, err := tw.Write(b); err != nil {
				return errors.Join(err, f.Close())
			}
		}
	}
	return errors.Join(tw.Close(), f.Close())
}
