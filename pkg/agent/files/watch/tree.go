package watch

import "path"

// dirTree is the set of directories a watch knows, relative to its root
// ("" is the root), with their subdirectories so that a removed directory's
// subtree is found without scanning the whole set.
type dirTree struct {
	nodes   map[string]*dirNode
	watched int // nodes with an inotify watch
}

// dirNode is one known directory.
type dirNode struct {
	rel     string
	watched bool
	subdirs map[string]struct{} // relative paths of the known children
}

func newDirTree() *dirTree { return &dirTree{nodes: map[string]*dirNode{}} }

// isDir reports whether rel is a known directory.
func (t *dirTree) isDir(rel string) bool { return t.nodes[rel] != nil }

// add returns the node of rel, creating it (and linking it to its parent,
// when that is known).
func (t *dirTree) add(rel string) *dirNode {
	if n := t.nodes[rel]; n != nil {
		return n
	}
	n := &dirNode{rel: rel, subdirs: map[string]struct{}{}}
	t.nodes[rel] = n
	if rel != "" {
		if p := t.nodes[parent(rel)]; p != nil {
			p.subdirs[rel] = struct{}{}
		}
	}
	return n
}

// remove forgets rel and its subtree and returns the forgotten nodes.
func (t *dirTree) remove(rel string) []*dirNode {
	n := t.nodes[rel]
	if n == nil {
		return nil
	}
	if p := t.nodes[parent(rel)]; p != nil && rel != "" {
		delete(p.subdirs, rel)
	}
	var out []*dirNode
	stack := []*dirNode{n}
	for len(stack) > 0 {
		d := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		delete(t.nodes, d.rel)
		if d.watched {
			t.watched--
		}
		out = append(out, d)
		for c := range d.subdirs {
			if cn := t.nodes[c]; cn != nil {
				stack = append(stack, cn)
			}
		}
	}
	return out
}

// parent returns the relative path of rel's directory ("" for the root's
// entries).
func parent(rel string) string {
	p := path.Dir(rel)
	if p == "." {
		return ""
	}
	return p
}
