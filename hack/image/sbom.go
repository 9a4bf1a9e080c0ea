package main

import (
	"debug/buildinfo"
	"encoding/json"
	"fmt"
	"runtime/debug"
	"slices"
	"strings"
	"time"
)

// SPDX 2.3 JSON, the fields a scanner reads: which Go modules, at which versions, went
// into the binary. Everything comes from the binary's own build information
// (debug/buildinfo), so the SBOM describes what was linked, not what go.mod lists.
type spdxDoc struct {
	SPDXVersion       string             `json:"spdxVersion"`
	DataLicense       string             `json:"dataLicense"`
	SPDXID            string             `json:"SPDXID"`
	Name              string             `json:"name"`
	DocumentNamespace string             `json:"documentNamespace"`
	CreationInfo      spdxCreation       `json:"creationInfo"`
	Packages          []spdxPackage      `json:"packages"`
	Relationships     []spdxRelationship `json:"relationships"`
}

type spdxCreation struct {
	Created  string   `json:"created"`
	Creators []string `json:"creators"`
}

type spdxPackage struct {
	Name             string       `json:"name"`
	SPDXID           string       `json:"SPDXID"`
	VersionInfo      string       `json:"versionInfo"`
	DownloadLocation string       `json:"downloadLocation"`
	FilesAnalyzed    bool         `json:"filesAnalyzed"`
	LicenseConcluded string       `json:"licenseConcluded"`
	LicenseDeclared  string       `json:"licenseDeclared"`
	CopyrightText    string       `json:"copyrightText"`
	PrimaryPurpose   string       `json:"primaryPackagePurpose,omitempty"`
	ExternalRefs     []spdxExtRef `json:"externalRefs"`
	Comment          string       `json:"comment,omitempty"`
}

type spdxExtRef struct {
	Category string `json:"referenceCategory"`
	Type     string `json:"referenceType"`
	Locator  string `json:"referenceLocator"`
}

type spdxRelationship struct {
	Element string `json:"spdxElementId"`
	Type    string `json:"relationshipType"`
	Related string `json:"relatedSpdxElement"`
}

// readBuildInfo reads the build information of each platform's binary and returns it
// once: the platforms must have linked the same modules, or one SBOM would describe
// only one of them.
func readBuildInfo(bins []platformBinary) (*debug.BuildInfo, error) {
	var first *debug.BuildInfo
	for _, b := range bins {
		bi, err := buildinfo.ReadFile(b.path)
		if err != nil {
			return nil, fmt.Errorf("build info of %s: %w", b.path, err)
		}
		if first == nil {
			first = bi
			continue
		}
		if modules(bi) != modules(first) || bi.GoVersion != first.GoVersion {
			return nil, fmt.Errorf("%s and %s were built from different modules or Go versions", bins[0].path, b.path)
		}
	}
	if first == nil {
		return nil, fmt.Errorf("no binaries")
	}
	return first, nil
}

func modules(bi *debug.BuildInfo) string {
	var b strings.Builder
	fmt.Fprintln(&b, bi.Path)
	for _, d := range bi.Deps {
		fmt.Fprintln(&b, d.Path, d.Version, d.Sum)
	}
	return b.String()
}

// sbom writes the SPDX document for the binary described by bi, released as version,
// whose image index has the given digest (which makes the document namespace unique).
func sbom(bi *debug.BuildInfo, version, source, indexDigest string, created time.Time) ([]byte, error) {
	mainID := "SPDXRef-Package-config-watcher"
	doc := spdxDoc{
		SPDXVersion:       "SPDX-2.3",
		DataLicense:       "CC0-1.0",
		SPDXID:            "SPDXRef-DOCUMENT",
		Name:              "config-watcher-" + version,
		DocumentNamespace: source + "/spdx/" + version + "/" + strings.TrimPrefix(indexDigest, "sha256:"),
		CreationInfo: spdxCreation{
			Created:  created.UTC().Format(time.RFC3339),
			Creators: []string{"Tool: config-watcher-hack-image"},
		},
	}
	doc.Packages = append(doc.Packages, goPackage(mainID, bi.Path, version, source, "APPLICATION",
		"the controller binary of every platform image (index "+indexDigest+")"))
	doc.Relationships = append(doc.Relationships, spdxRelationship{"SPDXRef-DOCUMENT", "DESCRIBES", mainID})
	std := goPackage("SPDXRef-Package-stdlib", "stdlib", strings.TrimPrefix(bi.GoVersion, "go"), "https://go.dev/dl/", "LIBRARY", "")
	doc.Packages = append(doc.Packages, std)
	doc.Relationships = append(doc.Relationships, spdxRelationship{mainID, "DEPENDS_ON", std.SPDXID})
	deps := slices.Clone(bi.Deps)
	slices.SortFunc(deps, func(a, b *debug.Module) int { return strings.Compare(a.Path, b.Path) })
	for i, d := range deps {
		m := d
		if d.Replace != nil {
			m = d.Replace
		}
		p := goPackage(fmt.Sprintf("SPDXRef-Package-%d", i+1), m.Path, m.Version, "https://proxy.golang.org/"+m.Path+"/@v/"+m.Version+".zip", "LIBRARY", "")
		if m.Sum != "" {
			p.Comment = "go.sum " + m.Sum
		}
		doc.Packages = append(doc.Packages, p)
		doc.Relationships = append(doc.Relationships, spdxRelationship{mainID, "DEPENDS_ON", p.SPDXID})
	}
	out, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(out, '\n'), nil
}

func goPackage(id, path, version, location, purpose, comment string) spdxPackage {
	return spdxPackage{
		Name: path, SPDXID: id, VersionInfo: version, DownloadLocation: location,
		LicenseConcluded: "NOASSERTION", LicenseDeclared: "NOASSERTION", CopyrightText: "NOASSERTION",
		PrimaryPurpose: purpose, Comment: comment,
		ExternalRefs: []spdxExtRef{{"PACKAGE-MANAGER", "purl", "pkg:golang/" + path + "@" + version}},
	}
}
