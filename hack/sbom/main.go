// Command idc-sbom checks each binary's SBOM against the build info the
// binary carries and writes the image's SBOM (hack/release.sh runs it).
//
//	idc-sbom -image idc-operator:0.2.0 -digest sha256:… -out image.cdx.json \
//	  manager=bin/linux/manager=dist/sbom/manager.cdx.json …
//
// The check: every module that `go version -m BINARY` lists (its main
// module, and each dependency with its version, after replacements) is a
// component of that binary's SBOM, with the same version; a missing one
// fails the release. The image's SBOM has the image as its subject
// (pkg:oci with the digest) and each binary as an application component
// holding that binary's modules.
package main

import (
	"debug/buildinfo"
	"errors"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"

	cdx "github.com/CycloneDX/cyclonedx-go"
)

func main() {
	image := flag.String("image", "", "the image's name:tag")
	digest := flag.String("digest", "", "the image's manifest digest (sha256:…)")
	out := flag.String("out", "", "where to write the image's SBOM")
	flag.Parse()
	if err := run(*image, *digest, *out, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "idc-sbom:", err)
		os.Exit(1)
	}
}

// binary is one NAME=BINARY=SBOM argument.
type binary struct{ name, path, sbom string }

func parseArgs(args []string) ([]binary, error) {
	var bins []binary
	for _, a := range args {
		parts := strings.Split(a, "=")
		if len(parts) != 3 || parts[0] == "" || parts[1] == "" || parts[2] == "" {
			return nil, fmt.Errorf("argument %q: want NAME=BINARY=SBOM", a)
		}
		bins = append(bins, binary{parts[0], parts[1], parts[2]})
	}
	if len(bins) == 0 {
		return nil, errors.New("no binaries given")
	}
	return bins, nil
}

func run(image, digest, out string, args []string) error {
	if image == "" || !strings.HasPrefix(digest, "sha256:") || out == "" {
		return errors.New("-image, -digest sha256:… and -out are required")
	}
	bins, err := parseArgs(args)
	if err != nil {
		return err
	}
	var apps []cdx.Component
	for _, b := range bins {
		bom, err := readBOM(b.sbom)
		if err != nil {
			return err
		}
		if err := check(b.path, bom); err != nil {
			return fmt.Errorf("%s: %w", b.name, err)
		}
		apps = append(apps, application(b.name, bom))
	}
	return writeBOM(out, imageBOM(image, digest, apps))
}

func readBOM(path string) (*cdx.BOM, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	bom := new(cdx.BOM)
	if err := cdx.NewBOMDecoder(f, cdx.BOMFileFormatJSON).Decode(bom); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return bom, nil
}

// modules returns what the binary's build info names: module path →
// version, the replacement's where a module is replaced (what was built).
func modules(path string) (map[string]string, error) {
	info, err := buildinfo.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the build info of %s: %w", path, err)
	}
	mods := map[string]string{info.Main.Path: info.Main.Version}
	for _, d := range info.Deps {
		if d.Replace != nil {
			d = d.Replace
		}
		mods[d.Path] = d.Version
	}
	return mods, nil
}

// check fails unless every module of the binary's build info is in bom
// with its version (the main module may be the BOM's subject, and a
// binary built from a work tree has the version "(devel)").
func check(path string, bom *cdx.BOM) error {
	want, err := modules(path)
	if err != nil {
		return err
	}
	have := map[string]string{}
	var walk func([]cdx.Component)
	walk = func(cs []cdx.Component) {
		for _, c := range cs {
			have[c.Name] = c.Version
			if c.Components != nil {
				walk(*c.Components)
			}
		}
	}
	if bom.Metadata != nil && bom.Metadata.Component != nil {
		walk([]cdx.Component{*bom.Metadata.Component})
	}
	if bom.Components != nil {
		walk(*bom.Components)
	}
	var missing []string
	for mod, v := range want {
		got, ok := have[mod]
		switch {
		case !ok:
			missing = append(missing, mod+"@"+v+" (absent)")
		case v != "(devel)" && v != "" && got != v:
			missing = append(missing, fmt.Sprintf("%s@%s (the SBOM says %s)", mod, v, got))
		}
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		return fmt.Errorf("the SBOM lacks %d of the %d modules `go version -m` lists: %s", len(missing), len(want), strings.Join(missing, ", "))
	}
	return nil
}

// application is one binary of the image: an application component
// holding the binary's modules.
func application(name string, bom *cdx.BOM) cdx.Component {
	app := cdx.Component{Type: cdx.ComponentTypeApplication, Name: name, BOMRef: "binary:" + name}
	if bom.Metadata != nil && bom.Metadata.Component != nil {
		app.Version = bom.Metadata.Component.Version
		app.PackageURL = bom.Metadata.Component.PackageURL
		app.Hashes = bom.Metadata.Component.Hashes
	}
	if bom.Components != nil {
		mods := make([]cdx.Component, len(*bom.Components))
		copy(mods, *bom.Components)
		for i := range mods {
			// bom-refs are unique per document: the same module is in
			// several binaries.
			mods[i].BOMRef = name + ":" + mods[i].BOMRef
		}
		app.Components = &mods
	}
	return app
}

func imageBOM(image, digest string, apps []cdx.Component) *cdx.BOM {
	name, tag, _ := strings.Cut(image, ":")
	bom := cdx.NewBOM()
	bom.SerialNumber = "" // the same bytes for the same build
	bom.Metadata = &cdx.Metadata{Component: &cdx.Component{
		Type: cdx.ComponentTypeContainer, Name: name, Version: tag, BOMRef: "image",
		PackageURL: "pkg:oci/" + name + "@" + strings.ReplaceAll(digest, ":", "%3A") + "?tag=" + tag,
		Hashes:     &[]cdx.Hash{{Algorithm: cdx.HashAlgoSHA256, Value: strings.TrimPrefix(digest, "sha256:")}},
	}}
	bom.Components = &apps
	refs := make([]string, len(apps))
	for i, a := range apps {
		refs[i] = a.BOMRef
	}
	bom.Dependencies = &[]cdx.Dependency{{Ref: "image", Dependencies: &refs}}
	return bom
}

func writeBOM(path string, bom *cdx.BOM) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	enc := cdx.NewBOMEncoder(f, cdx.BOMFileFormatJSON)
	enc.SetPretty(true)
	if err := enc.Encode(bom); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
