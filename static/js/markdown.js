// Safe markdown for model output: the subset chat models write (fenced code, inline code,
// bold/italics, lists, headings, quotes, links, paragraphs), built with DOM APIs only. Text
// goes in through textContent and text nodes, never innerHTML, so whatever the model writes
// (`<script>`, `<img onerror>`) is shown as text and can never become markup.

const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([^`\s]*)/;
const HEADING = /^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
const RULE = /^ {0,3}([-*_])(?:\s*\1){2,}\s*$/;
const LIST_ITEM = /^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$/;
const QUOTE = /^ {0,3}>\s?(.*)$/;
const ESCAPABLE = "\\`*_{}[]()#+-.!>~|";
const LANGUAGE = /^[\w+#.-]{1,32}$/;

/** Render `text` as a DocumentFragment; safe for any input. */
export function renderMarkdown(text) {
  const fragment = document.createDocumentFragment();
  renderBlocks(fragment, String(text ?? "").split(/\r?\n/));
  return fragment;
}

function element(tag, className) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  return node;
}

function renderBlocks(parent, lines) {
  let paragraph = null;
  let lists = []; // open lists, innermost last: {indent, node, item}
  const endParagraph = () => {
    paragraph = null;
  };
  const endLists = () => {
    lists = [];
  };

  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    const fence = FENCE.exec(line);
    if (fence) {
      endParagraph();
      endLists();
      const closing = new RegExp(`^ {0,3}${fence[1][0] === "`" ? "`" : "~"}{${fence[1].length},}\\s*$`);
      const body = [];
      i++;
      while (i < lines.length && !closing.test(lines[i])) body.push(lines[i++]);
      // An unclosed fence runs to the end: while streaming, the code block is still open.
      parent.append(codeBlock(body.join("\n"), fence[2]));
      continue;
    }
    if (!line.trim()) {
      endParagraph();
      // A blank line inside a list keeps the list open unless what follows is not an item.
      continue;
    }
    const heading = HEADING.exec(line);
    if (heading) {
      endParagraph();
      endLists();
      // Message headings sit below the page's own (h1 is the page, h2 the sections).
      const node = element(`h${Math.min(heading[1].length + 2, 6)}`);
      appendInline(node, heading[2]);
      parent.append(node);
      continue;
    }
    if (RULE.test(line)) {
      endParagraph();
      endLists();
      parent.append(element("hr"));
      continue;
    }
    const quote = QUOTE.exec(line);
    if (quote) {
      endParagraph();
      endLists();
      const quoted = [quote[1]];
      while (i + 1 < lines.length && QUOTE.test(lines[i + 1])) quoted.push(QUOTE.exec(lines[++i])[1]);
      const node = element("blockquote");
      renderBlocks(node, quoted);
      parent.append(node);
      continue;
    }
    const item = LIST_ITEM.exec(line);
    if (item) {
      endParagraph();
      lists = addListItem(parent, lists, item);
      continue;
    }
    const indent = line.length - line.trimStart().length;
    if (lists.length && (indent > 0 || lines[i - 1]?.trim())) {
      // A continuation line of the last item.
      const last = lists[lists.length - 1].item;
      last.append(element("br"));
      appendInline(last, line.trim());
      continue;
    }
    endLists();
    if (paragraph) {
      // Chat text means its line breaks.
      paragraph.append(element("br"));
    } else {
      paragraph = element("p");
      parent.append(paragraph);
    }
    appendInline(paragraph, line.trim());
  }
}

function addListItem(parent, lists, match) {
  const indent = match[1].replace(/\t/g, "    ").length;
  const ordered = /\d/.test(match[2]);
  while (lists.length && lists[lists.length - 1].indent > indent) lists.pop();
  let top = lists[lists.length - 1];
  if (top && top.indent === indent && top.ordered !== ordered) {
    lists.pop();
    top = lists[lists.length - 1];
  }
  if (!top || top.indent < indent) {
    const node = element(ordered ? "ol" : "ul");
    if (ordered) {
      const start = Number.parseInt(match[2], 10);
      if (start !== 1) node.start = start;
    }
    (top ? top.item : parent).append(node);
    top = { indent, ordered, node, item: null };
    lists = [...lists, top];
  }
  const item = element("li");
  appendInline(item, match[3]);
  top.node.append(item);
  top.item = item;
  return lists;
}

function codeBlock(code, language) {
  const figure = element("div", "code-block");
  const bar = element("div", "code-bar");
  const label = element("span", "code-language");
  label.textContent = LANGUAGE.test(language) ? language : "code";
  const copy = element("button", "copy-code");
  copy.type = "button";
  copy.textContent = "Copy code";
  copy.addEventListener("click", () => copyText(code, copy));
  bar.append(label, copy);
  const pre = element("pre");
  const codeNode = element("code");
  if (LANGUAGE.test(language)) codeNode.dataset.language = language;
  codeNode.textContent = code;
  pre.append(codeNode);
  figure.append(bar, pre);
  return figure;
}

/** Copy `text` to the clipboard and say so on `button` for a moment. */
export async function copyText(text, button) {
  const original = button.textContent;
  try {
    await navigator.clipboard.writeText(text);
    button.textContent = "Copied";
  } catch {
    button.textContent = "Copy failed";
  }
  setTimeout(() => {
    button.textContent = original;
  }, 1500);
}

// Inline spans: `code`, **strong**, *em*, _em_, [link](https://...), backslash escapes.
function appendInline(parent, text) {
  // Where a closing delimiter was searched for and not found: later searches from at or after
  // that position fail too, so unmatched `*` runs cost one scan, not one per delimiter.
  const noCloseFrom = new Map();
  let buffer = "";
  const flush = () => {
    if (buffer) parent.append(document.createTextNode(buffer));
    buffer = "";
  };
  let i = 0;
  while (i < text.length) {
    const ch = text[i];
    if (ch === "\\" && ESCAPABLE.includes(text[i + 1] ?? "")) {
      buffer += text[i + 1];
      i += 2;
      continue;
    }
    if (ch === "`") {
      let run = 1;
      while (text[i + run] === "`") run++;
      const fence = "`".repeat(run);
      const end = text.indexOf(fence, i + run);
      if (end !== -1) {
        flush();
        const code = element("code");
        code.textContent = text.slice(i + run, end);
        parent.append(code);
        i = end + run;
      } else {
        buffer += fence;
        i += run;
      }
      continue;
    }
    if (ch === "*" || ch === "_") {
      const delimiter = text[i + 1] === ch ? ch + ch : ch;
      const close = canOpen(text, i, delimiter) ? findClose(text, i, delimiter, noCloseFrom) : -1;
      if (close !== -1) {
        flush();
        const node = element(delimiter.length === 2 ? "strong" : "em");
        appendInline(node, text.slice(i + delimiter.length, close));
        parent.append(node);
        i = close + delimiter.length;
      } else {
        buffer += delimiter;
        i += delimiter.length;
      }
      continue;
    }
    if (ch === "[") {
      const link = /^\[([^\]\n]+)\]\(([^)\s]+)\)/.exec(text.slice(i));
      const href = link && safeHref(link[2]);
      if (href) {
        flush();
        const anchor = element("a");
        anchor.href = href;
        anchor.rel = "noopener noreferrer nofollow";
        anchor.target = "_blank";
        appendInline(anchor, link[1]);
        parent.append(anchor);
        i += link[0].length;
        continue;
      }
    }
    buffer += ch;
    i++;
  }
  flush();
}

function isWordChar(ch) {
  return ch !== undefined && /[\p{L}\p{N}]/u.test(ch);
}

function canOpen(text, at, delimiter) {
  const after = text[at + delimiter.length];
  if (after === undefined || /\s/.test(after)) return false;
  // snake_case_names are not emphasis.
  return !(delimiter[0] === "_" && isWordChar(text[at - 1]));
}

function findClose(text, open, delimiter, noCloseFrom) {
  let from = open + delimiter.length + 1;
  const failedFrom = noCloseFrom.get(delimiter);
  if (failedFrom !== undefined && from >= failedFrom) return -1;
  while (true) {
    const at = text.indexOf(delimiter, from);
    if (at === -1) {
      noCloseFrom.set(delimiter, Math.min(from, failedFrom ?? Infinity));
      return -1;
    }
    const before = text[at - 1];
    const after = text[at + delimiter.length];
    const partOfLongerRun = delimiter.length === 1 && (after === delimiter || before === delimiter);
    const closesWord = !(delimiter[0] === "_" && isWordChar(after));
    if (!/\s/.test(before) && !partOfLongerRun && closesWord) return at;
    from = at + 1;
  }
}

function safeHref(raw) {
  try {
    const url = new URL(raw);
    return url.protocol === "https:" || url.protocol === "http:" ? url.href : null;
  } catch {
    return null;
  }
}
