package effect

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/extract"
)

// sqlEffect runs the user's statement once per new message, all of a batch
// queued in one pgx.Batch (one round trip). Values are always bound as
// parameters, never spliced into the text.
type sqlEffect struct {
	stmt   string
	params []extract.Expr // params[i] binds $i+1
}

func newSQL(cfg *config.SQL) (*sqlEffect, error) {
	stmt, names, err := ConvertNamedParams(cfg.Statement)
	if err != nil {
		return nil, fmt.Errorf("while building the sql effect: %w", err)
	}
	e := &sqlEffect{stmt: stmt}
	for _, n := range names {
		expr, ok := cfg.Params[n]
		if !ok {
			return nil, fmt.Errorf("while building the sql effect: statement uses :%s, which is not among params %v", n, sortedKeys(cfg.Params))
		}
		c, err := extract.Compile(expr)
		if err != nil {
			return nil, fmt.Errorf("while building the sql effect: param %s: %w", n, err)
		}
		e.params = append(e.params, c)
	}
	return e, nil
}

func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func (e *sqlEffect) Transactional() bool { return true }

func (e *sqlEffect) Apply(ctx context.Context, tx pgx.Tx, recs []*Record) (Result, error) {
	var res Result
	b := &pgx.Batch{}
	for i, m := range recs {
		args, err := e.bind(m)
		if err != nil {
			res.Failed = append(res.Failed, Failure{Index: i, Err: err})
			continue
		}
		b.Queue(e.stmt, args...)
	}
	if b.Len() == 0 {
		return res, nil
	}
	br := tx.SendBatch(ctx, b)
	for range b.Len() {
		if _, err := br.Exec(); err != nil {
			_ = br.Close() // the statement error is the one worth reporting
			return res, fmt.Errorf("while running the sql effect: %w", err)
		}
		res.Applied++
	}
	if err := br.Close(); err != nil {
		return res, fmt.Errorf("while finishing the sql effect batch: %w", err)
	}
	return res, nil
}

func (e *sqlEffect) bind(m *Record) ([]any, error) {
	args := make([]any, len(e.params))
	for i, p := range e.params {
		v, err := p.Param(m)
		if err != nil {
			return nil, fmt.Errorf("param %s: %w", p, err)
		}
		args[i] = v
	}
	return args, nil
}

// ConvertNamedParams rewrites :name parameters as $1, $2… (one number per
// distinct name) and returns the names in number order. It leaves alone
// '::' casts, string literals ('…', E'…' with backslash escapes, $tag$…$tag$),
// quoted identifiers, and -- and (nested) /* */ comments. Positional $n
// parameters are refused: mixing both styles would misnumber them.
func ConvertNamedParams(stmt string) (string, []string, error) {
	return convert(stmt, false)
}

// ConvertNamedParamsMySQL rewrites :name parameters as ? placeholders for
// MySQL and MariaDB and returns the name of each placeholder in order (a
// name used twice is two placeholders). It follows MySQL's lexical rules
// (sql_mode without ANSI_QUOTES and NO_BACKSLASH_ESCAPES, the sink's): it
// leaves alone string literals ('…' and "…", backslash escapes and doubled
// quotes), `quoted` identifiers, # and "-- " line comments, /* */ comments
// (not nested in MySQL), and := assignments. Positional ? parameters are
// refused, as $n are on PostgreSQL.
func ConvertNamedParamsMySQL(stmt string) (string, []string, error) {
	return convert(stmt, true)
}

func convert(stmt string, mysql bool) (string, []string, error) {
	c := &converter{src: stmt, index: map[string]int{}, mysql: mysql}
	for c.pos < len(c.src) {
		if err := c.step(); err != nil {
			return "", nil, err
		}
	}
	return c.out.String(), c.names, nil
}

type converter struct {
	src   string
	pos   int
	out   strings.Builder
	names []string
	index map[string]int
	// mysql: MySQL's lexical rules and ? placeholders.
	mysql bool
}

func (c *converter) step() error {
	if c.mysql {
		return c.stepMySQL()
	}
	ch := c.src[c.pos]
	switch {
	case ch == '\'':
		return c.copyQuoted('\'', c.isEscapeString())
	case ch == '"':
		return c.copyQuoted('"', false)
	case strings.HasPrefix(c.src[c.pos:], "--"):
		c.copyLineComment()
	case strings.HasPrefix(c.src[c.pos:], "/*"):
		return c.copyBlockComment()
	case ch == '$':
		return c.dollar()
	case strings.HasPrefix(c.src[c.pos:], "::"):
		c.copyN(2)
	case ch == ':' && c.pos+1 < len(c.src) && isIdentStart(c.src[c.pos+1]):
		c.param()
	default:
		c.copyN(1)
	}
	return nil
}

func (c *converter) stepMySQL() error {
	ch := c.src[c.pos]
	rest := c.src[c.pos:]
	switch {
	case ch == '\'' || ch == '"':
		return c.copyQuoted(ch, true)
	case ch == '`':
		return c.copyQuoted('`', false)
	case ch == '#':
		c.copyLineComment()
	case strings.HasPrefix(rest, "--") && (len(rest) == 2 || rest[2] <= ' '):
		// MySQL's -- comment needs a space or control character after it.
		c.copyLineComment()
	case strings.HasPrefix(rest, "/*"):
		end := strings.Index(rest[2:], "*/")
		if end < 0 {
			return fmt.Errorf("unterminated comment at offset %d", c.pos)
		}
		c.copyN(end + 4)
	case ch == '?':
		return fmt.Errorf("positional parameter at offset %d: use :name parameters", c.pos)
	case strings.HasPrefix(rest, "::"):
		c.copyN(2)
	case ch == ':' && c.pos+1 < len(c.src) && isIdentStart(c.src[c.pos+1]) && (c.pos == 0 || !isIdentChar(c.src[c.pos-1])):
		c.param()
	default:
		c.copyN(1)
	}
	return nil
}

func (c *converter) copyN(n int) {
	c.out.WriteString(c.src[c.pos : c.pos+n])
	c.pos += n
}

// isEscapeString: a quote right after E/e that does not end a longer word.
func (c *converter) isEscapeString() bool {
	p := c.pos
	return p > 0 && (c.src[p-1] == 'E' || c.src[p-1] == 'e') && (p < 2 || !isIdentChar(c.src[p-2]))
}

func (c *converter) copyQuoted(q byte, backslash bool) error {
	start := c.pos
	for i := c.pos + 1; i < len(c.src); i++ {
		switch {
		case backslash && c.src[i] == '\\':
			i++
		case c.src[i] == q && i+1 < len(c.src) && c.src[i+1] == q:
			i++ // a doubled quote stays inside the literal
		case c.src[i] == q:
			c.pos = i + 1
			c.out.WriteString(c.src[start:c.pos])
			return nil
		}
	}
	return fmt.Errorf("unterminated %c quote at offset %d", q, start)
}

func (c *converter) copyLineComment() {
	i := strings.IndexByte(c.src[c.pos:], '\n')
	if i < 0 {
		c.copyN(len(c.src) - c.pos)
		return
	}
	c.copyN(i + 1)
}

func (c *converter) copyBlockComment() error {
	start, depth := c.pos, 0
	for i := c.pos; i+1 < len(c.src); i++ {
		switch c.src[i : i+2] {
		case "/*":
			depth++
			i++
		case "*/":
			depth--
			i++
			if depth == 0 {
				c.pos = i + 1
				c.out.WriteString(c.src[start:c.pos])
				return nil
			}
		}
	}
	return fmt.Errorf("unterminated comment at offset %d", start)
}

// dollar handles $tag$ quoting and refuses $n parameters.
func (c *converter) dollar() error {
	rest := c.src[c.pos+1:]
	if len(rest) > 0 && rest[0] >= '0' && rest[0] <= '9' {
		return fmt.Errorf("positional parameter at offset %d: use :name parameters", c.pos)
	}
	end := strings.IndexByte(rest, '$')
	if end < 0 || !isDollarTag(rest[:end]) || (c.pos > 0 && isIdentChar(c.src[c.pos-1])) {
		c.copyN(1)
		return nil
	}
	tag := c.src[c.pos : c.pos+end+2]
	closeAt := strings.Index(c.src[c.pos+len(tag):], tag)
	if closeAt < 0 {
		return fmt.Errorf("unterminated %s quote at offset %d", tag, c.pos)
	}
	c.copyN(len(tag) + closeAt + len(tag))
	return nil
}

func isDollarTag(s string) bool {
	for i := 0; i < len(s); i++ {
		if !isIdentChar(s[i]) || (i == 0 && !isIdentStart(s[i])) {
			return false
		}
	}
	return true
}

func (c *converter) param() {
	end := c.pos + 1
	for end < len(c.src) && isIdentChar(c.src[end]) {
		end++
	}
	name := c.src[c.pos+1 : end]
	if c.mysql {
		c.names = append(c.names, name)
		c.out.WriteByte('?')
		c.pos = end
		return
	}
	n, ok := c.index[name]
	if !ok {
		c.names = append(c.names, name)
		n = len(c.names)
		c.index[name] = n
	}
	c.out.WriteString("$" + strconv.Itoa(n))
	c.pos = end
}

func isIdentStart(b byte) bool {
	return b == '_' || (b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z')
}

func isIdentChar(b byte) bool { return isIdentStart(b) || (b >= '0' && b <= '9') }
