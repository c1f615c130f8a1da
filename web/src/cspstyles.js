// xterm.js writes its theme, cursor and selection rules with
// `styleElement.textContent = ...`, and the console's CSP (style-src 'self',
// no inline styles) blocks such <style> elements, which leaves a terminal
// without colours, cursor or selection. Constructed style sheets are CSSOM,
// which style-src does not govern: every <style> element made through
// document.createElement keeps its text out of the DOM and applies it as an
// adopted sheet instead (xterm.js scopes its rules to one terminal's class).
// Nothing else in the console makes <style> elements. The element handed
// back is an inert <sandboxd-style> (styles hide it): even an empty
// <style> counts as a violation when it is inserted.

const create = Document.prototype.createElement;
const textContent = Object.getOwnPropertyDescriptor(Node.prototype, 'textContent');

function adopt(el) {
  const sheet = new CSSStyleSheet();
  let text = '';
  let adopted = false;
  Object.defineProperty(el, 'textContent', {
    configurable: true,
    get: () => text,
    set: (v) => {
      text = String(v ?? '');
      sheet.replaceSync(text);
      if (!adopted) {
        adopted = true;
        document.adoptedStyleSheets = [...document.adoptedStyleSheets, sheet];
      }
    },
  });
  const remove = el.remove;
  el.remove = function () {
    if (adopted) {
      adopted = false;
      document.adoptedStyleSheets = document.adoptedStyleSheets.filter((s) => s !== sheet);
    }
    return remove.call(this);
  };
}

Document.prototype.createElement = function (tag, opts) {
  if (String(tag).toLowerCase() !== 'style' || !textContent) return create.call(this, tag, opts);
  const el = create.call(this, 'sandboxd-style');
  adopt(el);
  return el;
};

// xterm.js's DOM renderer also writes 24-bit colours with
// setAttribute('style', ...), which style-src-attr blocks; the same text
// through the CSSOM (element.style.cssText) is allowed.
const setAttribute = Element.prototype.setAttribute;
Element.prototype.setAttribute = function (name, value) {
  if (typeof name === 'string' && name.toLowerCase() === 'style' && this.style) {
    this.style.cssText = String(value);
    return;
  }
  return setAttribute.call(this, name, value);
};
