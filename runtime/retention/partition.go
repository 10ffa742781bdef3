package retention

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// A JetStream config with partitions > 0 reads a stream whose subjects are
// partitioned by a subject transform (nats-server 2.10 or later), e.g.
// subjects "orders.*" with the transform orders.* →
// orders.{{partition(4,1)}}.{{wildcard(1)}}: the server stores orders.abc
// as orders.<0..3>.abc, the partition a deterministic hash of the token.
// Partition i's durable is filtered to orders.i.*.

// The mapping functions as nats-server parses them (a whole token each;
// spaces allowed; the name's case is not significant here).
var (
	partitionToken = regexp.MustCompile(`(?i)^\{\{\s*partition\s*\(\s*(\d+)\s*(?:,[^)]*)?\)\s*\}\}$`)
	wildcardToken  = regexp.MustCompile(`(?i)^\{\{\s*wildcard\s*\(\s*\d+\s*\)\s*\}\}$`)
	legacyWildcard = regexp.MustCompile(`^\$\d+$`)
	anyFunction    = regexp.MustCompile(`^\{\{.*\}\}$`)
)

// PartitionsMinServer is the first nats-server with subject transforms.
const PartitionsMinServer = "2.10"

// PartitionsSupported says whether a nats-server of version (its INFO's,
// e.g. "2.9.10") can partition a stream: nil from 2.10 on.
func PartitionsSupported(version string) error {
	major, minor, ok := serverVersion(version)
	if !ok || major > 2 || (major == 2 && minor >= 10) {
		// An unparsable version is not refused on a guess: the stream's
		// transform is checked anyway.
		return nil
	}
	return fmt.Errorf("partitions needs nats-server %s or later (this server is %s): it partitions the stream's subjects with a subject transform", PartitionsMinServer, version)
}

func serverVersion(v string) (major, minor int, ok bool) {
	parts := strings.SplitN(strings.TrimPrefix(v, "v"), ".", 3)
	if len(parts) < 2 {
		return 0, 0, false
	}
	var err1, err2 error
	major, err1 = strconv.Atoi(parts[0])
	minor, err2 = strconv.Atoi(parts[1])
	return major, minor, err1 == nil && err2 == nil
}

// PartitionFilter derives partition i's filter subject (0 <= i < n) from
// the stream's subject transform that partitions it into n: its
// destination with the {{partition(n,...)}} token replaced by i and every
// {{wildcard(k)}} (or legacy $k) token by *, literal tokens kept; e.g.
// orders.{{partition(4,1)}}.{{wildcard(1)}} → orders.<i>.*. The errors say
// what to change on the stream: no partitioning transform (with the `nats
// stream edit` command adding one, built from the stream's subjects), one
// partitioning into another number, or a destination whose filter cannot
// be derived (another mapping function, several partition tokens).
func PartitionFilter(st jetstream.StreamConfig, n, i int) (string, error) {
	if n < 2 || i < 0 || i >= n {
		return "", fmt.Errorf("partition %d of %d does not exist (partitions are 0..%d)", i, n, n-1)
	}
	t := st.SubjectTransform
	if t == nil || !strings.Contains(strings.ToLower(t.Destination), "partition") {
		has := "no subject transform"
		if t != nil {
			has = fmt.Sprintf("the subject transform %s → %s, which does not partition", t.Source, t.Destination)
		}
		return "", fmt.Errorf("JetStream stream %s has %s (partitions: %d needs a subject transform whose destination holds {{partition(%d,...)}}); add one, e.g. %s",
			st.Name, has, n, n, suggestTransform(st, n))
	}
	var out []string
	found := 0
	for _, tok := range strings.Split(t.Destination, ".") {
		switch m := partitionToken.FindStringSubmatch(tok); {
		case m != nil:
			found++
			if got, _ := strconv.Atoi(m[1]); got != n {
				return "", fmt.Errorf("JetStream stream %s partitions its subjects into %d (subject transform %s → %s), but partitions is %d: set partitions to %d, or change the transform's {{partition(%d,...)}} to {{partition(%d,...)}} (nats stream edit %s --transform-destination ...)",
					st.Name, got, t.Source, t.Destination, n, got, got, n, st.Name)
			}
			out = append(out, strconv.Itoa(i))
		case wildcardToken.MatchString(tok), legacyWildcard.MatchString(tok):
			out = append(out, "*")
		case anyFunction.MatchString(tok):
			return "", fmt.Errorf("JetStream stream %s's subject transform destination %s uses %s: a partition's filter subject can be derived only from literal tokens, {{wildcard(k)}} and one {{partition(%d,...)}}",
				st.Name, t.Destination, tok, n)
		default:
			out = append(out, tok)
		}
	}
	if found != 1 {
		return "", fmt.Errorf("JetStream stream %s's subject transform destination %s holds %d {{partition(...)}} tokens as whole tokens; partitions needs exactly one", st.Name, t.Destination, found)
	}
	return strings.Join(out, "."), nil
}

// suggestTransform is the `nats stream edit` command adding a partitioning
// transform to st, built from its first subject: each * becomes
// {{wildcard(k)}} and the partition token, hashing every *, follows the
// literal prefix.
func suggestTransform(st jetstream.StreamConfig, n int) string {
	src := "orders.*"
	if len(st.Subjects) > 0 {
		src = st.Subjects[0]
	}
	toks := strings.Split(src, ".")
	if toks[len(toks)-1] == ">" {
		// The partition hashes * tokens; > cannot be referenced.
		toks[len(toks)-1] = "*"
	}
	var dest, wild []string
	placed := false
	for _, tok := range toks {
		if tok == "*" {
			wild = append(wild, strconv.Itoa(len(wild)+1))
		}
	}
	if len(wild) == 0 {
		toks = append(toks, "*")
		wild = []string{"1"}
	}
	j := 0
	for _, tok := range toks {
		if tok == "*" {
			if !placed {
				dest = append(dest, fmt.Sprintf("{{partition(%d,%s)}}", n, strings.Join(wild, ",")))
				placed = true
			}
			j++
			dest = append(dest, fmt.Sprintf("{{wildcard(%d)}}", j))
			continue
		}
		dest = append(dest, tok)
	}
	return fmt.Sprintf("nats stream edit %s --transform-source '%s' --transform-destination '%s' (needs nats-server %s or later)",
		st.Name, strings.Join(toks, "."), strings.Join(dest, "."), PartitionsMinServer)
}
