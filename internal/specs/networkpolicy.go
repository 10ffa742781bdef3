package specs

import (
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"sort"
	"strconv"
	"strings"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// NetworkPolicy limits the consumer pods' egress to DNS and the
// endpoints the runtime dials. A host given as an IP address is allowed on
// its port alone (a /32 or /128); a host name can only be allowed by port
// (NetworkPolicy has no DNS names), to any address. Ingress is left alone
// (the metrics port is scraped).
func NetworkPolicy(idc *messagingv1alpha1.IdempotentConsumer, rc *RuntimeConfig, getenv func(string) string) *networkingv1.NetworkPolicy {
	np := &networkingv1.NetworkPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"},
		ObjectMeta: metav1.ObjectMeta{Name: DeploymentName(idc), Namespace: idc.Namespace, Labels: Labels(idc, ComponentConsumer)},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{
				"app.kubernetes.io/name": "idc-runtime", "app.kubernetes.io/instance": idc.Name,
			}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
		},
	}
	udp, tcp := corev1.ProtocolUDP, corev1.ProtocolTCP
	dns := intstr.FromInt32(53)
	rules := []networkingv1.NetworkPolicyEgressRule{{Ports: []networkingv1.NetworkPolicyPort{{Protocol: &udp, Port: &dns}, {Protocol: &tcp, Port: &dns}}}}
	if rc == nil {
		np.Spec.Egress = rules
		return np
	}
	eps := egressEndpoints(rc.Config, getenv)
	sort.Slice(eps, func(i, j int) bool { return eps[i].host+fmt.Sprint(eps[i].port) < eps[j].host+fmt.Sprint(eps[j].port) })
	for _, ep := range eps {
		port := intstr.FromInt32(ep.port)
		rule := networkingv1.NetworkPolicyEgressRule{Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}}}
		if ip, err := netip.ParseAddr(strings.Trim(ep.host, "[]")); err == nil {
			rule.To = []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: netip.PrefixFrom(ip, ip.BitLen()).String()}}}
		}
		rules = append(rules, rule)
	}
	np.Spec.Egress = rules
	return np
}

// endpoint is a host and port the runtime connects to.
type endpoint struct {
	host string
	port int32
}

// endpoints collects host:port pairs, parsing the forms the specs use.
type endpoints []endpoint

func (e *endpoints) add(host string, port int) {
	// A Unix socket (a host that is a path) is no network endpoint.
	if host == "" || strings.HasPrefix(host, "/") || port <= 0 || port >= 65536 {
		return
	}
	ep := endpoint{host: host, port: int32(port)}
	for _, have := range *e {
		if have == ep {
			return
		}
	}
	*e = append(*e, ep)
}

// hostPort adds "host:port", or "host" on defPort.
func (e *endpoints) hostPort(hp string, defPort int) {
	host, p, err := net.SplitHostPort(hp)
	if err != nil {
		host, p = hp, ""
	}
	port := defPort
	if p != "" {
		port, _ = strconv.Atoi(p)
	}
	e.add(host, port)
}

// fromURL adds each of comma-separated URLs, on its scheme's default port
// when it names none.
func (e *endpoints) fromURL(raw string, ports map[string]int) {
	for _, one := range strings.Split(raw, ",") {
		u, err := url.Parse(strings.TrimSpace(one))
		if err != nil || u.Host == "" {
			continue
		}
		e.hostPort(u.Host, ports[u.Scheme])
	}
}

var (
	natsPorts = map[string]int{"nats": 4222, "tls": 4222, "": 4222, "ws": 80, "wss": 443}
	amqpPorts = map[string]int{"amqp": 5672, "amqps": 5671}
	httpPorts = map[string]int{"http": 80, "https": 443}
)

// egressEndpoints lists what the runtime dials: the sink database (from the
// DSN), the source and emit brokers, the RabbitMQ management API and the
// http effect's endpoint. Entries it cannot parse are left out (the
// runtime reports those itself).
func egressEndpoints(cfg *config.Config, getenv func(string) string) []endpoint {
	var out endpoints
	out.sink(cfg.Sink, getenv(cfg.Sink.DSNEnv))
	out.source(cfg.Source, getenv)
	if e := cfg.Emit; e != nil {
		out.emit(e, getenv)
	}
	if h := cfg.Sink.Effect.HTTP; h != nil {
		out.fromURL(h.URL, httpPorts)
	}
	return out
}

// sink adds the sink database's address from its DSN.
func (e *endpoints) sink(s config.Sink, dsn string) {
	if s.DatabaseKind() == config.SinkMySQL {
		// A go-sql-driver/mysql DSN: tcp(host:port), 3306 when it names no
		// port; a unix socket is no network endpoint.
		if mc, err := mysql.ParseDSN(dsn); dsn != "" && err == nil && mc.Net == "tcp" {
			e.hostPort(mc.Addr, 3306)
		}
		return
	}
	// pgx's default host for an empty DSN is a Unix socket: none then.
	if pc, err := pgx.ParseConfig(dsn); err == nil {
		e.add(pc.Host, int(pc.Port))
		for _, f := range pc.Fallbacks {
			e.add(f.Host, int(f.Port))
		}
	}
}

func (e *endpoints) source(src config.Source, getenv func(string) string) {
	switch {
	case src.NATSJetStream != nil:
		e.fromURL(src.NATSJetStream.URL, natsPorts)
	case src.Kafka != nil:
		for _, b := range src.Kafka.BootstrapServers {
			e.hostPort(b, 9092)
		}
	case src.RabbitMQ != nil:
		uri := getenv(src.RabbitMQ.URIEnv)
		e.fromURL(uri, amqpPorts)
		if src.RabbitMQ.ManagementURL != "" {
			e.fromURL(src.RabbitMQ.ManagementURL, httpPorts)
		} else if u, err := url.Parse(uri); err == nil && u.Hostname() != "" {
			mgmt := 15672 // the management plugin's port the runtime derives
			if u.Scheme == "amqps" {
				mgmt = 15671
			}
			e.add(u.Hostname(), mgmt)
		}
	case src.RedisStreams != nil:
		e.hostPort(src.RedisStreams.Address, 6379)
	}
}

func (e *endpoints) emit(em *config.Emit, getenv func(string) string) {
	switch {
	case em.NATSJetStream != nil:
		e.fromURL(em.NATSJetStream.URL, natsPorts)
	case em.Kafka != nil:
		for _, b := range em.Kafka.BootstrapServers {
			e.hostPort(b, 9092)
		}
	case em.RabbitMQ != nil:
		e.fromURL(getenv(em.RabbitMQ.URIEnv), amqpPorts)
	case em.RedisStreams != nil:
		e.hostPort(em.RedisStreams.Address, 6379)
	}
}
